package arch

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ownedGoroutines are the packages in which every goroutine has an owner
// that waits for it: a rungroup.Group part, or a sync.WaitGroup's Go whose
// Wait comes before the work that started it returns (or before its
// owner's Stop or Close). A bare go statement starts one nobody waits for,
// which a stop then races: a loop that writes to a store already closed, a
// driver that outlives its engine.
var ownedGoroutines = []string{
	"internal/server",
	"internal/workflow",
	"internal/identity",
	"internal/node",
	"internal/dnsproxy",
}

func TestNoBareGoStatement(t *testing.T) {
	for _, pkg := range ownedGoroutines {
		t.Run(pkg, func(t *testing.T) {
			dir := filepath.Join("..", "..", pkg)
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			fset := token.NewFileSet()
			parsed := 0
			for _, e := range entries {
				name := e.Name()
				if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
					continue
				}
				f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
				if err != nil {
					t.Fatal(err)
				}
				parsed++
				ast.Inspect(f, func(n ast.Node) bool {
					if g, ok := n.(*ast.GoStmt); ok {
						pos := fset.Position(g.Pos())
						t.Errorf("%s:%d: bare go statement: start it in a rungroup.Group or a sync.WaitGroup that its owner waits for", filepath.ToSlash(filepath.Join(pkg, name)), pos.Line)
					}
					return true
				})
			}
			if parsed == 0 {
				t.Fatalf("no Go files in %s: the list names a package that moved", dir)
			}
		})
	}
}
