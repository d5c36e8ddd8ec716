// Package spec is where Tether's semantics become checkable. SPEC.md beside
// this file is the normative text; spec_test.go keeps its rule → scenario
// table true. The invariants as Go predicates, the porcupine models and the
// exhaustive explorer shared by the simulator and the property suites live
// here as they are built.
package spec
