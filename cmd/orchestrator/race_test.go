//go:build race

package main

// raceBuild: this test binary runs under the race detector, so the binaries
// it starts are built with -race too, and a race they report fails the test
// (see start).
const raceBuild = true
