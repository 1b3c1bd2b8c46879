package depcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// userPackages are what a user imports; engines are what their exported
// API must not name (issue 14: the backends live underneath).
var (
	userPackages = []string{"collective", "overlap", "p2p", "launcher", "rendezvous"}
	engines      = []string{"intra", "inter", "kernels", "nvshmem", "cudagraph"}
)

// loadTypes type-checks pkgs from the compiler's export data, which
// `go list -export` builds (cgo packages included).
func loadTypes(t *testing.T, pkgs []string) map[string]*types.Package {
	t.Helper()
	args := []string{"list", "-export", "-deps", "-json=ImportPath,Export"}
	for _, p := range pkgs {
		args = append(args, module+"/"+p)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.String())
	}
	export := map[string]string{}
	for d := json.NewDecoder(bytes.NewReader(out)); d.More(); {
		var p struct{ ImportPath, Export string }
		if err := d.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		export[p.ImportPath] = p.Export
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		f, ok := export[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	got := map[string]*types.Package{}
	for _, p := range pkgs {
		tp, err := imp.Import(module + "/" + p)
		if err != nil {
			t.Fatalf("importing %s: %v", p, err)
		}
		got[p] = tp
	}
	return got
}

// engineRefs is every place in pkg's exported API that names a type of a
// package in banned, as "pkg.Ident: names bannedpkg.Type".
func engineRefs(pkg *types.Package, banned []string) []string {
	isBanned := func(p *types.Package) bool {
		if p == nil {
			return false
		}
		rel := strings.TrimPrefix(p.Path(), module+"/")
		for _, b := range banned {
			if rel == b || strings.HasPrefix(rel, b+"/") {
				return true
			}
		}
		return false
	}
	var refs []string
	var where string
	seen := map[types.Type]bool{}
	var walk func(types.Type)
	walk = func(t types.Type) {
		if t == nil || seen[t] {
			return
		}
		seen[t] = true
		defer delete(seen, t) // a type may be named from several places
		switch t := t.(type) {
		case *types.Alias:
			if o := t.Obj(); isBanned(o.Pkg()) {
				refs = append(refs, where+": names "+o.Pkg().Name()+"."+o.Name())
				return
			}
			walk(types.Unalias(t))
		case *types.Named:
			if o := t.Obj(); isBanned(o.Pkg()) {
				refs = append(refs, where+": names "+o.Pkg().Name()+"."+o.Name())
				return
			}
			for i := range t.TypeArgs().Len() {
				walk(t.TypeArgs().At(i))
			}
			// A named type of another package is that package's business.
		case *types.Pointer:
			walk(t.Elem())
		case *types.Slice:
			walk(t.Elem())
		case *types.Array:
			walk(t.Elem())
		case *types.Map:
			walk(t.Key())
			walk(t.Elem())
		case *types.Chan:
			walk(t.Elem())
		case *types.Signature:
			for i := range t.Params().Len() {
				walk(t.Params().At(i).Type())
			}
			for i := range t.Results().Len() {
				walk(t.Results().At(i).Type())
			}
			for i := range t.TypeParams().Len() {
				walk(t.TypeParams().At(i).Constraint())
			}
		case *types.Struct:
			for i := range t.NumFields() {
				if f := t.Field(i); f.Exported() || f.Embedded() {
					walk(f.Type())
				}
			}
		case *types.Interface:
			for i := range t.NumEmbeddeds() {
				walk(t.EmbeddedType(i))
			}
			for i := range t.NumExplicitMethods() {
				if m := t.ExplicitMethod(i); m.Exported() {
					walk(m.Type())
				}
			}
		case *types.Union:
			for i := range t.Len() {
				walk(t.Term(i).Type())
			}
		case *types.TypeParam:
			walk(t.Constraint())
		}
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		where = pkg.Name() + "." + name
		switch obj := obj.(type) {
		case *types.TypeName:
			if obj.IsAlias() {
				walk(obj.Type())
				continue
			}
			named, ok := obj.Type().(*types.Named)
			if !ok {
				continue
			}
			for i := range named.TypeParams().Len() {
				walk(named.TypeParams().At(i).Constraint())
			}
			walk(named.Underlying())
			for i := range named.NumMethods() {
				if m := named.Method(i); m.Exported() {
					where = pkg.Name() + "." + name + "." + m.Name()
					walk(m.Type())
				}
			}
		default: // funcs, vars, consts
			walk(obj.Type())
		}
	}
	return refs
}

// TestUserAPINamesNoEngineType walks the exported API of the user
// packages (functions' and methods' signatures, exported struct fields,
// aliases, variables' and constants' types) and fails on every type of an
// engine package it names.
func TestUserAPINamesNoEngineType(t *testing.T) {
	pkgs := loadTypes(t, userPackages)
	for _, p := range userPackages {
		for _, r := range engineRefs(pkgs[p], engines) {
			t.Error(r)
		}
	}
}

// TestEngineRefsFound checks the walker on a package that does name
// engine types: device's API names kernels types.
func TestEngineRefsFound(t *testing.T) {
	pkgs := loadTypes(t, []string{"device"})
	refs := engineRefs(pkgs["device"], []string{"kernels"})
	if len(refs) == 0 {
		t.Fatal("device's API names no kernels type, the walker found none")
	}
	if !strings.Contains(strings.Join(refs, "\n"), "names kernels.") {
		t.Errorf("refs %q", refs)
	}
}
