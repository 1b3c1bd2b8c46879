package depcheck

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/slimego/slimego"

// table is the "Packages (top level)" table of ARCHITECTURE.md: each
// package and what it may import directly. An import is allowed where the
// table's arrows reach it (collective "depends on everything below", so
// what collective may reach, its users may too); it never points up. A
// folder's subpackages (cmd/x, examples/x) take its row. Edges marked
// "beyond the table" are in the code and not in ARCHITECTURE.md's column:
// docs/DESIGN.md should state them.
var table = map[string][]string{
	"collective": {"rendezvous", "device", "intra", "inter", "nvshmem", "cudagraph", "kernels", "topology"},
	"rendezvous": {},
	"launcher":   {"rendezvous"},
	"device":     {"kernels"},
	// beyond the table: the engines exchange addresses and ids through the
	// rendezvous store (a stdlib-only leaf).
	"intra":     {"device", "rendezvous"},
	"inter":     {"device", "intra", "rendezvous"},
	"nvshmem":   {"kernels", "device", "rendezvous"}, // beyond the table: device, rendezvous
	"cudagraph": {"device"},
	"kernels":   {},
	// beyond the table: NVML's GPU topology, a leaf that collective and
	// slimerun read.
	"topology":       {},
	"overlap":        {"collective", "device"},
	"p2p":            {"device", "inter", "rendezvous"},
	"bench":          {"collective", "overlap", "p2p"},
	"cmd/slimerun":   {"launcher", "bench"},
	"cmd/slimebench": {"launcher", "bench"},
	"examples":       {"collective", "overlap", "p2p", "rendezvous"},
	// helpers under internal/ that build on the API (every other internal
	// package imports no package of the table)
	"internal/interleave":  {"collective"},
	"internal/testranks":   {"collective"},
	"internal/teststore":   {"rendezvous"},
	"internal/cmd/agcheck": {"collective", "overlap"},
}

// direct names the rows whose packages are users of the API: they import
// only what their row names, not everything it reaches, so that no engine
// package leaks into them through collective's "everything below". The
// extra entries are what the code still needs beyond the table.
var direct = map[string][]string{
	// overlap: nothing beyond its row (its GEMMs and buffers are
	// device's interfaces, its TestMain loads the emulator through device).
	"overlap":  {},
	"examples": {"device"},
}

// row is the table row that governs package p (module-relative), or "".
func row(p string) string {
	for q := p; q != "" && q != "."; {
		if _, ok := table[q]; ok {
			return q
		}
		i := strings.LastIndexByte(q, '/')
		if i < 0 {
			break
		}
		q = q[:i]
	}
	if strings.HasPrefix(p, "internal/") {
		return "internal"
	}
	return ""
}

// reach is every row that row r may import: the closure of its arrows.
func reach(r string) map[string]bool {
	seen := map[string]bool{}
	var walk func(string)
	walk = func(r string) {
		for _, d := range table[r] {
			if !seen[d] {
				seen[d] = true
				walk(d)
			}
		}
	}
	walk(r)
	return seen
}

type listed struct {
	ImportPath                         string
	Imports, TestImports, XTestImports []string
}

// goList lists the module's packages with their imports.
func goList(t *testing.T) []listed {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,TestImports,XTestImports", module+"/...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var ps []listed
	for d := json.NewDecoder(bytes.NewReader(out)); d.More(); {
		var p listed
		if err := d.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		ps = append(ps, p)
	}
	return ps
}

// violations is every import of ps that the table does not allow, as
// "importer imports imported (why)".
func violations(ps []listed) []string {
	var bad []string
	for _, p := range ps {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		r := row(rel)
		if r == "" {
			bad = append(bad, rel+" has no row in the package table")
			continue
		}
		ok := reach(r)
		if extra, strict := direct[r]; strict {
			ok = map[string]bool{}
			for _, d := range append(slices.Clone(table[r]), extra...) {
				ok[d] = true
			}
		}
		all := slices.Concat(p.Imports, p.TestImports, p.XTestImports)
		slices.Sort(all)
		all = slices.Compact(all)
		for _, imp := range all {
			if !strings.HasPrefix(imp, module+"/") {
				continue // stdlib and other modules
			}
			irel := strings.TrimPrefix(imp, module+"/")
			ir := row(irel)
			switch {
			case irel == rel || ir == r:
				// itself (external tests) or a package of its own row
			case strings.HasPrefix(irel, "internal/") && !strings.HasPrefix(irel, "internal/cmd/"):
				// helpers under internal/ serve every package
			case ir == "" || !ok[ir]:
				bad = append(bad, rel+" imports "+irel+" (row "+r+" reaches "+keys(ok)+")")
			}
		}
	}
	return bad
}

func keys(m map[string]bool) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	if len(ks) == 0 {
		return "no package of the table"
	}
	return strings.Join(ks, ", ")
}

// TestImportsPointDown checks every package's imports (its tests' too)
// against the table.
func TestImportsPointDown(t *testing.T) {
	ps := goList(t)
	if len(ps) < 10 {
		t.Fatalf("go list found %d packages", len(ps))
	}
	for _, v := range violations(ps) {
		t.Error(v)
	}
}

// TestViolationsNamed checks the checker: an upward import, a sideways
// one and a package outside the table are each named.
func TestViolationsNamed(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    listed
		want string
	}{
		{"upward", listed{ImportPath: module + "/intra", Imports: []string{module + "/collective"}}, "intra imports collective"},
		{"sideways", listed{ImportPath: module + "/launcher", Imports: []string{module + "/device"}}, "launcher imports device"},
		{"test import", listed{ImportPath: module + "/kernels", XTestImports: []string{module + "/device"}}, "kernels imports device"},
		{"upward from overlap", listed{ImportPath: module + "/overlap", Imports: []string{module + "/bench"}}, "overlap imports bench"},
		{"engine into overlap", listed{ImportPath: module + "/overlap", Imports: []string{module + "/intra"}}, "overlap imports intra"},
		{"engine into an example", listed{ImportPath: module + "/examples/x", Imports: []string{module + "/cudagraph"}}, "examples/x imports cudagraph"},
		{"no row", listed{ImportPath: module + "/newthing"}, "newthing has no row"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := violations([]listed{tc.p})
			if len(v) != 1 || !strings.HasPrefix(v[0], tc.want) {
				t.Errorf("violations = %q, want one starting %q", v, tc.want)
			}
		})
	}
	if v := violations([]listed{{ImportPath: module + "/bench", Imports: []string{module + "/inter", module + "/internal/pattern", "fmt"}}}); len(v) != 0 {
		t.Errorf("a downward import is named: %q", v)
	}
}
