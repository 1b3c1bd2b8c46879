module github.com/slimego/slimego

go 1.26
