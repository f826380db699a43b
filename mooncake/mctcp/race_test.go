//go:build race

package mctcp

const raceEnabled = true
