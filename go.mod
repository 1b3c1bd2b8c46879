module github.com/slimego/slimego

go 1.26.0

require (
	github.com/spf13/pflag v1.1.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	gonum.org/v1/gonum v0.17.0 // indirect
)
