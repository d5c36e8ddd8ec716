//go:build race

package main

// raceBuild: this test binary runs under the race detector, so the binaries
// the soak starts are built with -race too, and a race they report fails it.
const raceBuild = true
