module github.com/tether-run/tether

go 1.26

require (
	github.com/cockroachdb/datadriven v1.0.3 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
)
