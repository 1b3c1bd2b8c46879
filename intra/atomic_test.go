package intra

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"sort"
	"strings"
	"testing"
)

// The shared-memory structs' fields, by how other processes may touch
// them while this one does. Every field must be listed, so that a new one
// is classified when it is added.
var (
	// Read or written by other processes at any time: only through
	// sync/atomic (or internal/futex, whose word the kernel reads
	// atomically).
	atomicFields = map[string]bool{
		"ctrl.bell": true, "ctrl.sleeping": true, "ctrl.state": true, "ctrl.pid": true,
		"ctrl.self": true, "ctrl.cmaOK": true, "ctrl.blame": true,
		"header.epoch":     true,
		"ackLine.consumed": true, "ackLine.ack": true,
	}
	// Written by the owner before it stores header.epoch (a release) and
	// read by others only after they load it (an acquire): plain accesses
	// are ordered by the epoch.
	publishedFields = map[string]bool{
		"header.size": true, "header.hash": true, "header.zcBuf": true, "header.mode": true,
		"header.zcOff": true, "header.inline": true,
	}
)

// TestSharedMemoryAtomics is a static guard (chosen over typed atomics,
// which would change the segment's structs; this test changes no product
// code): it type-checks the package and requires every access to a
// shared-memory field that other processes read concurrently to be &x.f
// passed to a sync/atomic (or internal/futex) function, and every ring
// slot stamp (the *uint64 elements of Group.stamps) to be used only as
// such an argument. On amd64 a plain store in place of an atomic one
// passes every run; this test fails on it.
func TestSharedMemoryAtomics(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, f := range pkgs["intra"].Files {
		files = append(files, f)
	}
	sort.Slice(files, func(i, j int) bool { return fset.File(files[i].Pos()).Name() < fset.File(files[j].Pos()).Name() })
	info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}, Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil), Error: func(err error) { t.Logf("type-checking: %v", err) }}
	pkg, _ := conf.Check("github.com/slimego/slimego/intra", fset, files, info)

	// The fields of each shared struct, by object.
	field := map[*types.Var]string{}
	for _, name := range []string{"ctrl", "header", "ackLine"} {
		obj := pkg.Scope().Lookup(name)
		if obj == nil {
			t.Fatalf("type %s not found", name)
		}
		st := obj.Type().Underlying().(*types.Struct)
		for f := range st.Fields() {
			if f.Name() == "_" {
				continue
			}
			key := name + "." + f.Name()
			if !atomicFields[key] && !publishedFields[key] {
				t.Errorf("shared-memory field %s is not classified: add it to atomicFields or publishedFields", key)
			}
			field[f] = key
		}
	}
	var stamps *types.Var
	if g, ok := pkg.Scope().Lookup("Group").Type().Underlying().(*types.Struct); ok {
		for f := range g.Fields() {
			if f.Name() == "stamps" {
				stamps = f
			}
		}
	}
	if stamps == nil {
		t.Fatal("Group.stamps not found")
	}

	atomicCall := func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return false
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		pn, ok := info.Uses[sel.Sel].(*types.Func)
		return ok && pn.Pkg() != nil && (pn.Pkg().Path() == "sync/atomic" || strings.HasSuffix(pn.Pkg().Path(), "/internal/futex"))
	}
	unsafePointer := func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return false
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		tn, ok := info.Uses[sel.Sel].(*types.TypeName)
		return ok && tn.Pkg() != nil && tn.Pkg().Path() == "unsafe" && tn.Name() == "Pointer"
	}
	isArg := func(call ast.Node, arg ast.Expr) bool {
		for _, a := range call.(*ast.CallExpr).Args {
			if a == arg {
				return true
			}
		}
		return false
	}
	checked := map[string]int{}
	for _, f := range files {
		var stack []ast.Node
		ast.Inspect(f, func(n ast.Node) bool {
			if n == nil {
				stack = stack[:len(stack)-1]
				return true
			}
			parent := func(k int) ast.Node {
				if len(stack) >= k {
					return stack[len(stack)-k]
				}
				return nil
			}
			switch x := n.(type) {
			case *ast.SelectorExpr:
				s := info.Selections[x]
				if s == nil {
					break
				}
				v, _ := s.Obj().(*types.Var)
				if key := field[v]; atomicFields[key] {
					checked[key]++
					amp, ok := parent(1).(*ast.UnaryExpr)
					if ok && amp.Op == token.AND && unsafePointer(parent(2)) {
						break // the address alone, as the CMA target (ctrl.self)
					}
					if !ok || amp.Op != token.AND || !atomicCall(parent(2)) || !isArg(parent(2), amp) {
						t.Errorf("%v: %s accessed without sync/atomic", fset.Position(x.Pos()), key)
					}
				}
				if v == stamps {
					// g.stamps[r][k]: an argument of an atomic call, or
					// the left side of the assignment that sets it up.
					in, ok1 := parent(1).(*ast.IndexExpr)
					out, ok2 := parent(2).(*ast.IndexExpr)
					if !ok1 || !ok2 || out.X != in {
						break
					}
					checked["stamp"]++
					if atomicCall(parent(3)) && isArg(parent(3), out) {
						break
					}
					if as, ok := parent(3).(*ast.AssignStmt); ok {
						lhs := false
						for _, l := range as.Lhs {
							lhs = lhs || l == out
						}
						if lhs {
							break
						}
					}
					t.Errorf("%v: a ring slot stamp used other than through sync/atomic", fset.Position(x.Pos()))
				}
			}
			stack = append(stack, n)
			return true
		})
	}
	// The guard looked at something: every atomic field and the stamps.
	for key := range atomicFields {
		if checked[key] == 0 {
			t.Errorf("no access to %s found: the test does not see the package", key)
		}
	}
	if checked["stamp"] < 2 {
		t.Errorf("%d stamp accesses found", checked["stamp"])
	}
}
