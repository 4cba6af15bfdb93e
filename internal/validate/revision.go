package validate

import (
	"strconv"
	"strings"
)

// revisionSep joins a template's name and a revision number. '@' is not in
// a DNS-1123 label, so a revision's name never collides with a template's.
const revisionSep = "@"

// RevisionName is the name of revision rev of template name: "NAME@REV".
func RevisionName(name string, rev int64) string {
	return name + revisionSep + strconv.FormatInt(rev, 10)
}

// TemplateRef parses "NAME" (revision 0: the latest) or "NAME@REV".
func TemplateRef(path, ref string) (name string, rev int64, err error) {
	name, num, found := strings.Cut(ref, revisionSep)
	if err := Name(path, name); err != nil {
		return "", 0, err
	}
	if !found {
		return name, 0, nil
	}
	rev, perr := strconv.ParseInt(num, 10, 64)
	if perr != nil || rev < 1 {
		return "", 0, fieldErr(path, "%q: the revision after %q must be a number from 1", ref, revisionSep)
	}
	return name, rev, nil
}

// TemplateOfRevision is the template name of a revision's name.
func TemplateOfRevision(revision string) string {
	name, _, _ := strings.Cut(revision, revisionSep)
	return name
}

// Revision checks a requested revision number (0: the latest).
func Revision(path string, rev int64) error {
	if rev < 0 {
		return fieldErr(path, "%d: a revision is a number from 1 (0 for the latest)", rev)
	}
	return nil
}
