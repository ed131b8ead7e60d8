module orderpipe.dev/keda-formula

go 1.22

require github.com/expr-lang/expr v1.17.8
