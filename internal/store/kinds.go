package store

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/validate"
)

// The kinds and their indexed filter columns (documented on Tx). A column
// holds exactly what a Filter value is compared with.
var (
	spaceKind    = newKind[*torporv1.Space]("space", "spaces")
	templateKind = newKind("template", "templates",
		enumColumn("phase", func(t *torporv1.Template) torporv1.TemplatePhase { return t.GetStatus().GetPhase() }),
	)
	revisionKind = newKind("template revision", "template_revisions",
		enumColumn("phase", func(t *torporv1.Template) torporv1.TemplatePhase { return t.GetStatus().GetPhase() }),
		textColumn("template", func(t *torporv1.Template) string { return validate.TemplateOfRevision(t.GetMetadata().GetName()) }),
	)
	actorKind = newKind("actor", "actors",
		enumColumn("state", func(a *torporv1.Actor) torporv1.ActorState { return a.GetStatus().GetState() }),
		textColumn("template", func(a *torporv1.Actor) string {
			return validate.RevisionName(a.GetSpec().GetTemplate(), a.GetSpec().GetTemplateRevision())
		}),
		textColumn("worker", func(a *torporv1.Actor) string {
			w := a.GetStatus().GetWorker()
			return WorkerKey(w.GetNamespace(), w.GetName())
		}),
		// Unique where not empty (migration 8): a sandbox ID names one
		// actor across spaces.
		textColumn("sandbox", SandboxID),
	)
	workerKind = newKind("worker", "workers",
		textColumn("node", func(w *torporv1.Worker) string { return w.GetSpec().GetNode() }),
		textColumn("pool", func(w *torporv1.Worker) string { return w.GetSpec().GetPool() }),
		textColumn("actor", func(w *torporv1.Worker) string { return w.GetStatus().GetActor().GetUid() }),
	)
	snapshotKind = newKind("snapshot", "snapshots",
		textColumn("actor_uid", (*torporv1.Snapshot).GetActorUid),
		textColumn("node", (*torporv1.Snapshot).GetNode),
		textColumn("template_uid", (*torporv1.Snapshot).GetTemplateUid),
		// Forks share their source's files: a location's files may go only
		// when no record names it.
		textColumn("location", (*torporv1.Snapshot).GetLocation),
	)
	tagKind = newKind("snapshot tag", "snapshot_tags",
		textColumn("snapshot", (*torporv1.SnapshotTag).GetSnapshot),
	)
	nodeKind = newKind[*torporv1.Node]("node", "nodes")
)

// SandboxID is the value of an actor's "sandbox" filter column: its name
// when it is an E2B sandbox (spec.sandbox set), else "".
func SandboxID(a *torporv1.Actor) string {
	if a.GetSpec().GetSandbox() == nil {
		return ""
	}
	return a.GetMetadata().GetName()
}

// WorkerKey is the value of an actor's "worker" filter column: the
// assigned worker's "namespace/name", or "" when it has none.
func WorkerKey(namespace, name string) string {
	if namespace == "" && name == "" {
		return ""
	}
	return namespace + "/" + name
}

// column is one indexed filter column of a kind.
type column[T Object] struct {
	name  string
	value func(T) string
	// normalize checks a filter value and turns it into the stored form.
	normalize func(string) (string, error)
}

func textColumn[T Object](name string, value func(T) string) column[T] {
	return column[T]{name: name, value: value, normalize: func(v string) (string, error) { return v, nil }}
}

// enumColumn stores the enum value's full name (ACTOR_STATE_RUNNING); a
// filter may also give it without the prefix (RUNNING, running).
func enumColumn[T Object, E protoreflect.Enum](name string, get func(T) E) column[T] {
	var zero E
	values := zero.Descriptor().Values()
	prefix := strings.TrimSuffix(string(values.ByNumber(0).Name()), "UNSPECIFIED")
	return column[T]{
		name: name,
		value: func(obj T) string {
			n := get(obj).Number()
			if v := values.ByNumber(n); v != nil {
				return string(v.Name())
			}
			return fmt.Sprint(n)
		},
		normalize: func(v string) (string, error) {
			up := strings.ToUpper(v)
			for _, candidate := range []string{up, prefix + up} {
				if values.ByName(protoreflect.Name(candidate)) != nil {
					return candidate, nil
				}
			}
			return "", fmt.Errorf("filter %s: unknown value %q: %w", name, v, ErrInvalidArgument)
		},
	}
}

// kind describes how one record type maps onto its table.
type kind[T Object] struct {
	name    string // singular, for messages
	table   string
	columns []column[T]
	meta    protoreflect.FieldDescriptor

	insertSQL, updateSQL, getSQL, currentSQL string
	// updateKeeping[m] is the update that leaves the columns in bit set m
	// (bit i: columns[i]) out of its SET list and requires their values in
	// its WHERE clause (see columns.go). updateKeeping[0] is updateSQL.
	updateKeeping []string
}

const recordColumns = "space, name, uid, version, create_time, update_time, data"

func newKind[T Object](name, table string, columns ...column[T]) *kind[T] {
	k := &kind[T]{name: name, table: table, columns: columns}
	k.meta = newObject[T]().ProtoReflect().Descriptor().Fields().ByName("metadata")
	if k.meta == nil {
		panic(fmt.Sprintf("store: %s message has no metadata field", name))
	}

	names := []string{"space", "name", "uid", "version", "create_time", "update_time", "data"}
	sets := []string{"version = $1", "update_time = $2", "data = $3"}
	for i, c := range columns {
		names = append(names, c.name)
		sets = append(sets, fmt.Sprintf("%s = $%d", c.name, 4+i))
	}
	k.insertSQL = fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s) ON CONFLICT DO NOTHING",
		table, strings.Join(names, ", "), placeholders(1, len(names)))
	n := len(sets)
	k.updateSQL = fmt.Sprintf("UPDATE %s SET %s WHERE space = $%d AND name = $%d AND uid = $%d AND version = $%d RETURNING create_time",
		table, strings.Join(sets, ", "), n+1, n+2, n+3, n+4)
	k.updateKeeping = make([]string, 1<<len(columns))
	for m := range k.updateKeeping {
		sets := []string{"version = $1", "update_time = $2", "data = $3"}
		var kept []string
		n := 3
		for i, c := range columns {
			if m&(1<<i) == 0 {
				n++
				sets = append(sets, fmt.Sprintf("%s = $%d", c.name, n))
			}
		}
		where := fmt.Sprintf("space = $%d AND name = $%d AND uid = $%d AND version = $%d", n+1, n+2, n+3, n+4)
		n += 4
		for i, c := range columns {
			if m&(1<<i) != 0 {
				n++
				kept = append(kept, fmt.Sprintf(" AND %s = $%d", c.name, n))
			}
		}
		k.updateKeeping[m] = fmt.Sprintf("UPDATE %s SET %s WHERE %s%s RETURNING create_time", table, strings.Join(sets, ", "), where, strings.Join(kept, ""))
	}
	if k.updateKeeping[0] != k.updateSQL {
		panic(fmt.Sprintf("store: %s: update statements disagree:\n%s\n%s", name, k.updateKeeping[0], k.updateSQL))
	}
	k.getSQL = fmt.Sprintf("SELECT %s FROM %s WHERE space = $1 AND name = $2", recordColumns, table)
	k.currentSQL = fmt.Sprintf("SELECT uid, version FROM %s WHERE space = $1 AND name = $2", table)
	return k
}

func (k *kind[T]) column(name string) (column[T], bool) {
	for _, c := range k.columns {
		if c.name == name {
			return c, true
		}
	}
	return column[T]{}, false
}

func (k *kind[T]) columnNames() string {
	if len(k.columns) == 0 {
		return "none"
	}
	names := make([]string, len(k.columns))
	for i, c := range k.columns {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

// metadata returns obj's metadata, creating it if unset.
func (k *kind[T]) metadata(obj T) *torporv1.ObjectMeta {
	return obj.ProtoReflect().Mutable(k.meta).Message().Interface().(*torporv1.ObjectMeta)
}

func newObject[T Object]() T {
	var zero T
	return zero.ProtoReflect().Type().New().Interface().(T)
}

// placeholders returns "$from, ..., $(from+n-1)".
func placeholders(from, n int) string {
	p := make([]string, n)
	for i := range p {
		p[i] = fmt.Sprintf("$%d", from+i)
	}
	return strings.Join(p, ", ")
}
