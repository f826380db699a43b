package main

// explain adds to err what to do about it, where te can tell.
func explain(err error) error { return err }
