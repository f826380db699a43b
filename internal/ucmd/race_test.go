//go:build race

package ucmd

const raceEnabled = true
