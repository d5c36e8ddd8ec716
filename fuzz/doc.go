// Package fuzz holds Tether's go test -fuzz targets for everything that
// decodes bytes: the store's record encoding (here), and in time the
// workflow parser and byte streams decoded into core inputs. `make test`
// replays the committed corpora; `go test -fuzz=<Target> ./fuzz` explores.
package fuzz
