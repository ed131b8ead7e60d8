// Command keda-formula evaluates ScaledObject scalingModifiers formulas the
// way KEDA does (apis/keda/v1alpha1 ValidateAndCompileScalingModifiers): the
// formula is wrapped in float(...) unless it starts with it, compiled with
// expr-lang/expr against the named triggers (AsFloat64), and run.
//
// Input (stdin, JSON): [{"formula": "...", "triggers": ["lag", ...],
// "cases": [{"lag": 5000, ...}, ...]}]. Output (stdout, JSON): one list of
// values per formula, or an error naming the formula.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/expr-lang/expr"
)

type formula struct {
	Formula  string               `json:"formula"`
	Triggers []string             `json:"triggers"`
	Cases    []map[string]float64 `json:"cases"`
}

func main() {
	var in []formula
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fail("reading the input: %v", err)
	}
	out := make([][]float64, 0, len(in))
	for _, f := range in {
		text := f.Formula
		if !strings.HasPrefix(text, "float(") {
			text = "float(" + text + ")"
		}
		// KEDA compiles against every named trigger with a dummy value.
		env := map[string]float64{}
		for _, name := range f.Triggers {
			env[name] = 1
		}
		program, err := expr.Compile(text, expr.Env(env), expr.AsFloat64())
		if err != nil {
			fail("formula %q: %v", f.Formula, err)
		}
		values := make([]float64, 0, len(f.Cases))
		for _, c := range f.Cases {
			v, err := expr.Run(program, c)
			if err != nil {
				fail("formula %q with %v: %v", f.Formula, c, err)
			}
			values = append(values, v.(float64))
		}
		out = append(out, values)
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "keda-formula: "+format+"\n", args...)
	os.Exit(1)
}
