//go:build unix && race

package main

func init() { raceEnabled = true }
