package cli

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/validate"
)

var templateKind = &kind[*torporv1.Template]{
	name:   "template",
	plural: "templates",
	sample: "counter",
	spaced: true,
	columns: []column[*torporv1.Template]{
		{"REVISION", func(t *torporv1.Template) string { return strconv.FormatInt(t.GetStatus().GetRevision(), 10) }},
		{"PHASE", func(t *torporv1.Template) string { return enumName(t.GetStatus().GetPhase()) }},
		{"CLASS", func(t *torporv1.Template) string { return t.GetSpec().GetSandboxClass() }},
		{"CONTAINERS", func(t *torporv1.Template) string {
			names := make([]string, len(t.GetSpec().GetContainers()))
			for i, c := range t.GetSpec().GetContainers() {
				names[i] = c.GetName()
			}
			return strings.Join(names, ",")
		}},
	},
	get: func(ctx context.Context, c *clients, req *torporv1.GetRequest) (*torporv1.Template, error) {
		return call(ctx, c.templates.GetTemplate, req)
	},
	list: func(ctx context.Context, c *clients, req *torporv1.ListRequest) ([]*torporv1.Template, string, error) {
		resp, err := call(ctx, c.templates.ListTemplates, req)
		return resp.GetTemplates(), resp.GetNextPageToken(), err
	},
	delete: func(ctx context.Context, c *clients, req *torporv1.DeleteRequest) error {
		_, err := call(ctx, c.templates.DeleteTemplate, req)
		return err
	},
}

func newTemplateCommand(a *app) *cobra.Command {
	noun := templateKind.nounCommand(a, "Manage templates: named lists of immutable revisions actors are made from (NAME is the latest, NAME@REV one revision)")
	noun.AddCommand(newTemplateApplyCommand(a), newTemplateHistoryCommand(a), newTemplateRolloutCommand(a), newTemplateRebuildCommand(a))
	return noun
}

func newTemplateApplyCommand(a *app) *cobra.Command {
	var files []string
	var wait waitFlags
	cmd := &cobra.Command{
		Use:     "apply -f FILE",
		Example: "  torpor template apply -f examples/counter/template.yaml --wait\n  torpor template get counter -o yaml | torpor template apply -f -",
		Aliases: []string{"create"},
		Short:   "Create the templates of YAML files, or new revisions of them",
		Long: "Create the templates of YAML files. Image tags are pinned by digest and every\n" +
			"template is checked before any is sent. Applying an identical template again\n" +
			"leaves it unchanged; a changed one becomes a new revision of the name, with its\n" +
			"own golden snapshot. Actors stay on the revision they run until moved\n" +
			"(torpor actor update NAME --template T, or torpor template rollout T).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var manifests []*manifest
			for _, file := range files {
				ms, err := a.readTemplateFile(cmd, file)
				if err != nil {
					return err
				}
				manifests = append(manifests, ms...)
			}
			if err := checkDistinct(manifests); err != nil {
				return err
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			for _, m := range manifests {
				t, verb, err := applyTemplate(cmd.Context(), c, m.template)
				if err != nil {
					return err
				}
				if err := templateKind.printChanged(cmd.OutOrStdout(), a.output, t, verb); err != nil {
					return err
				}
				if wait.on {
					if err := waitForGolden(cmd.Context(), cmd.ErrOrStderr(), c, t, wait.timeout); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "template YAML file, - for stdin (repeatable)")
	wait.register(cmd, "each template's golden snapshot is ready, printing its progress")
	_ = cmd.MarkFlagRequired("filename") // the flag exists: cannot fail
	return cmd
}

// readTemplateFile loads the templates of one file ("-" reads stdin).
func (a *app) readTemplateFile(cmd *cobra.Command, file string) ([]*manifest, error) {
	var (
		data    []byte
		baseDir string
		err     error
	)
	if file == "-" {
		data, err = readManifest(cmd.InOrStdin())
		file, baseDir = "<stdin>", "."
	} else {
		data, err = readManifestFile(file)
		baseDir = filepath.Dir(file)
	}
	if err != nil {
		return nil, fmt.Errorf("read templates: %w", err)
	}
	if baseDir, err = filepath.Abs(baseDir); err != nil {
		return nil, fmt.Errorf("read templates from %s: %w", file, err)
	}
	return loadTemplates(cmd.Context(), file, data, baseDir, a.space, cmd.Flags().Changed("space"))
}

// loadTemplates parses, pins and validates the templates of a file whose
// relative image paths start at baseDir. A document without a space gets
// space; one with a space must agree with it when the user chose it.
func loadTemplates(ctx context.Context, file string, data []byte, baseDir, space string, spaceChosen bool) ([]*manifest, error) {
	manifests, err := parseTemplates(file, data)
	if err != nil {
		return nil, err
	}
	for _, m := range manifests {
		meta := m.template.GetMetadata()
		if meta == nil {
			meta = &torporv1.ObjectMeta{}
			m.template.Metadata = meta
		}
		switch {
		case meta.GetSpace() == "":
			meta.Space = space
		case spaceChosen && meta.GetSpace() != space:
			return nil, m.errorAt("metadata.space", fmt.Errorf("metadata.space: %q differs from --space %q", meta.GetSpace(), space))
		}
		if err := m.pinImages(ctx, baseDir); err != nil {
			return nil, err
		}
		if err := m.validate(); err != nil {
			return nil, err
		}
	}
	return manifests, nil
}

// checkDistinct refuses two documents naming one template: the second
// would fail on the server after the first was written.
func checkDistinct(manifests []*manifest) error {
	first := map[string]*manifest{}
	for _, m := range manifests {
		key := m.template.GetMetadata().GetSpace() + "/" + m.template.GetMetadata().GetName()
		if prev, ok := first[key]; ok {
			return m.errorAt("metadata.name", fmt.Errorf("template %s is also defined at %s:%d", key, prev.file, prev.lineOf("metadata.name")))
		}
		first[key] = m
	}
	return nil
}

// applyTemplate applies t and says what that did: created, unchanged
// (the spec is the latest revision's), or a new revision.
func applyTemplate(ctx context.Context, c *clients, t *torporv1.Template) (*torporv1.Template, string, error) {
	before, err := call(ctx, c.templates.GetTemplate, &torporv1.GetRequest{Space: t.GetMetadata().GetSpace(), Name: t.GetMetadata().GetName()})
	if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
		return nil, "", err
	}
	stored, err := call(ctx, c.templates.CreateTemplate, &torporv1.CreateTemplateRequest{Template: t})
	if err != nil {
		return nil, "", err
	}
	switch rev := stored.GetStatus().GetRevision(); {
	case before == nil:
		return stored, "created", nil
	case rev == before.GetStatus().GetRevision():
		return stored, "unchanged", nil
	default:
		return stored, fmt.Sprintf("revised: revision %d (actors on older revisions stay there until moved: torpor template rollout %s)", rev, t.GetMetadata().GetName()), nil
	}
}

// revisionRef names the revision t shows: "NAME@REV".
func revisionRef(t *torporv1.Template) string {
	return validate.RevisionName(t.GetMetadata().GetName(), t.GetStatus().GetRevision())
}

// waitForGolden polls the revision t shows until its golden snapshot is
// READY or the build FAILED, printing a line whenever its phase or message
// changes.
func waitForGolden(ctx context.Context, out io.Writer, c *clients, t *torporv1.Template, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start := time.Now()
	key := &torporv1.GetRequest{Space: t.GetMetadata().GetSpace(), Name: revisionRef(t)}
	last := ""
	for {
		st := t.GetStatus()
		line := enumName(st.GetPhase())
		if st.GetMessage() != "" {
			line += ": " + st.GetMessage()
		}
		if line != last {
			fmt.Fprintf(out, "template/%s golden snapshot: %s (%s)\n", key.GetName(), line, time.Since(start).Round(100*time.Millisecond))
			last = line
		}
		switch st.GetPhase() {
		case torporv1.TemplatePhase_TEMPLATE_PHASE_READY:
			return nil
		case torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED:
			return fmt.Errorf("template %s: golden snapshot failed: %s", key.GetName(), st.GetMessage())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("template %s: golden snapshot not ready after %s (phase %s)", key.GetName(), limit, enumName(st.GetPhase()))
		case <-time.After(200 * time.Millisecond):
		}
		var err error
		if t, err = call(ctx, c.templates.GetTemplate, key); err != nil {
			return err
		}
	}
}

func newTemplateHistoryCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "history NAME",
		Example: "  torpor template history counter",
		Short:   "List a template's revisions and how many actors use each",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), c.templates.ListTemplateRevisions, &torporv1.GetRequest{Space: a.space, Name: args[0]})
			if err != nil {
				return err
			}
			if a.output != formatTable {
				return printMessages(cmd.OutOrStdout(), a.output, []proto.Message{resp}, false)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "REVISION\tPHASE\tACTORS\tUID\tAGE")
			for _, r := range resp.GetRevisions() {
				t := r.GetTemplate()
				rev := revisionRef(t)
				if t.GetStatus().GetRevision() == t.GetStatus().GetLatestRevision() {
					rev += " (latest)"
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", rev, enumName(t.GetStatus().GetPhase()), r.GetActors(), t.GetMetadata().GetUid(), age(t.GetMetadata().GetCreateTime(), time.Now()))
			}
			return w.Flush()
		},
	}
}

func newTemplateRolloutCommand(a *app) *cobra.Command {
	var req torporv1.RolloutTemplateRequest
	cmd := &cobra.Command{
		Use:     "rollout NAME [--allow-state-loss]",
		Example: "  torpor template rollout counter",
		Short:   "Move every actor on an older revision of a template to its latest",
		Long: "Move every actor on an older revision of a template to its latest revision, as\n" +
			"torpor actor update NAME --template T would, one actor at a time. Actors that\n" +
			"cannot move stay where they are and are listed with the reason: one that is not\n" +
			"suspended or crashed, or whose move would lose state (a volume its snapshot\n" +
			"holds is missing or mounted elsewhere, or the snapshot holds no durable data),\n" +
			"unless --allow-state-loss accepts that. Exits non-zero when one did not move.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			req.Space, req.Name = a.space, args[0]
			resp, err := call(cmd.Context(), c.templates.RolloutTemplate, &req)
			if err != nil {
				return err
			}
			if a.output != formatTable {
				return printMessages(cmd.OutOrStdout(), a.output, []proto.Message{resp}, false)
			}
			target := revisionRef(resp.GetTemplate())
			stayed := 0
			for _, r := range resp.GetResults() {
				from := validate.RevisionName(args[0], r.GetFromRevision())
				if r.GetMoved() {
					line := fmt.Sprintf("actor/%s moved from %s to %s", r.GetActor(), from, target)
					if r.GetMessage() != "" {
						line += " (" + r.GetMessage() + ")"
					}
					fmt.Fprintln(cmd.OutOrStdout(), line)
					continue
				}
				stayed++
				fmt.Fprintf(cmd.OutOrStdout(), "actor/%s stays on %s: %s\n", r.GetActor(), from, r.GetMessage())
			}
			if len(resp.GetResults()) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "every actor of template/%s is on %s\n", args[0], target)
			}
			if stayed > 0 {
				return fmt.Errorf("%d of %d actors stayed on older revisions of %s", stayed, len(resp.GetResults()), args[0])
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&req.AllowStateLoss, "allow-state-loss", false, "also move actors whose move loses state (recorded in each actor's events)")
	return cmd
}

func newTemplateRebuildCommand(a *app) *cobra.Command {
	var wait waitFlags
	cmd := &cobra.Command{
		Use:     "rebuild NAME[@REV]",
		Example: "  torpor template rebuild counter\n  torpor template rebuild counter@2",
		Short:   "Build the golden snapshot of a FAILED template revision again (default: the latest)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			t, err := call(cmd.Context(), c.templates.RebuildTemplate, &torporv1.GetRequest{Space: a.space, Name: args[0]})
			if err != nil {
				return err
			}
			if err := templateKind.printChanged(cmd.OutOrStdout(), a.output, t, "rebuilding revision "+strconv.FormatInt(t.GetStatus().GetRevision(), 10)); err != nil {
				return err
			}
			if wait.on {
				return waitForGolden(cmd.Context(), cmd.ErrOrStderr(), c, t, wait.timeout)
			}
			return nil
		},
	}
	wait.register(cmd, "the golden snapshot is ready, printing its progress")
	return cmd
}
