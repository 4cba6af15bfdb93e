package arch

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The node agent answers its API at one edge (internal/node/edge.go): it
// decodes each call, delegates to the slot lifecycle or the data plane,
// and maps errors of a kind to status codes once. Inside the node errors
// carry a kind (errdefs), not a code, and the types behind the edge never
// see an RPC type, so a new concern cannot grow back into a handler.
const nodeDir = "../node"

// nodeEdgeFiles are the files of internal/node that may make status
// errors.
var nodeEdgeFiles = map[string]bool{"edge.go": true}

// nodeInnerTypes are the types behind the edge.
var nodeInnerTypes = []string{"slotMachine", "dataPlane"}

// rpcTypes are connect's types of a call's request, response and streams.
var rpcTypes = map[string]bool{"Request": true, "Response": true, "ServerStream": true, "ClientStream": true, "BidiStream": true}

const connectPath = "connectrpc.com/connect"

func TestNodeStatusErrorsOnlyAtTheEdge(t *testing.T) {
	fset, files := parseNode(t)
	for name, f := range files {
		if nodeEdgeFiles[filepath.Base(name)] {
			continue
		}
		local := importName(f, connectPath)
		if local == "" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && isPkgSel(sel, local, "NewError") {
				t.Errorf("%s: connect.NewError outside the node's edge (edge.go): return an error of a kind (errdefs) and let the edge map it", position(fset, sel.Pos()))
			}
			return true
		})
	}
}

func TestNodeInnerTypesTakeNoRPCTypes(t *testing.T) {
	fset, files := parseNode(t)
	methods := 0
	for _, f := range files {
		local := importName(f, connectPath)
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || len(fn.Recv.List) != 1 {
				continue
			}
			recv := receiverType(fn.Recv.List[0].Type)
			if !slices.Contains(nodeInnerTypes, recv) {
				continue
			}
			methods++
			if local == "" {
				continue
			}
			ast.Inspect(fn.Type, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok && rpcTypes[sel.Sel.Name] && isPkgSel(sel, local, sel.Sel.Name) {
					t.Errorf("%s: %s.%s takes or returns connect.%s: RPC types belong to the node's edge (edge.go)", position(fset, fn.Pos()), recv, fn.Name.Name, sel.Sel.Name)
				}
				return true
			})
		}
	}
	if methods < 20 {
		t.Fatalf("found %d methods of %v in %s: the parse missed them", methods, nodeInnerTypes, nodeDir)
	}
}

// parseNode parses internal/node's non-test files.
func parseNode(t *testing.T) (*token.FileSet, map[string]*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join(nodeDir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]*ast.File{}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files[p] = f
	}
	if len(files) < 20 {
		t.Fatalf("parsed %d files in %s: the glob missed the package", len(files), nodeDir)
	}
	return fset, files
}

func position(fset *token.FileSet, pos token.Pos) string {
	p := fset.Position(pos)
	return filepath.Join("internal/node", filepath.Base(p.Filename)) + ":" + strconv.Itoa(p.Line)
}

// importName is the name f knows the package at path by, or "".
func importName(f *ast.File, path string) string {
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == path {
			if imp.Name != nil {
				return imp.Name.Name
			}
			return filepath.Base(path)
		}
	}
	return ""
}

func isPkgSel(sel *ast.SelectorExpr, pkg, name string) bool {
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg && sel.Sel.Name == name
}

// receiverType is the name of a method receiver's type (T of T or *T,
// generic or not).
func receiverType(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return receiverType(t.X)
	case *ast.IndexExpr:
		return receiverType(t.X)
	case *ast.IndexListExpr:
		return receiverType(t.X)
	case *ast.Ident:
		return t.Name
	}
	return ""
}
