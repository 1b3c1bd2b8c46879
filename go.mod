module github.com/slimego/slimego

go 1.26.0

require (
	github.com/spf13/pflag v1.1.0
	golang.org/x/sys v0.50.0
	gonum.org/v1/gonum v0.17.0
)
