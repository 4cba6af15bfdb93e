package envd

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
)

// uploaded is how /files describes a file it wrote.
type uploaded struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// download serves GET /files?path=P[&username=U]: the file's bytes.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("path") == "" {
		writeHTTPError(w, http.StatusBadRequest, errors.New("path: required"))
		return
	}
	path := s.users.lookup(q.Get("username")).abs(q.Get("path"))
	f, err := os.Open(path)
	if err != nil {
		writeFileError(w, "read", path, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeFileError(w, "read", path, err)
		return
	}
	if fi.IsDir() {
		writeHTTPError(w, http.StatusBadRequest, fmt.Errorf("read %s: a directory, not a file", path))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": fi.Name()}))
	http.ServeContent(w, r, fi.Name(), fi.ModTime(), f)
}

// upload serves POST /files: a multipart form whose "file" parts are
// written to path (when given) or to their file names, or (envd 0.5.7)
// an application/octet-stream body written to path; gzip content
// encoding is undone. Missing directories are made; files and
// directories made belong to the user. The answer lists what was
// written.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	user := s.users.lookup(q.Get("username"))
	body := io.Reader(r.Body)
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeHTTPError(w, http.StatusBadRequest, fmt.Errorf("body: gzip: %w", err))
			return
		}
		body = zr
	default:
		writeHTTPError(w, http.StatusBadRequest, fmt.Errorf("content-encoding %q: want gzip or none", enc))
		return
	}
	ct, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		writeHTTPError(w, http.StatusBadRequest, fmt.Errorf("content-type: %w", err))
		return
	}
	var written []uploaded
	switch ct {
	case "application/octet-stream":
		if q.Get("path") == "" {
			writeHTTPError(w, http.StatusBadRequest, errors.New("path: required for an octet-stream upload"))
			return
		}
		path := user.abs(q.Get("path"))
		if status, err := writeFile(user, path, body); err != nil {
			writeHTTPError(w, status, err)
			return
		}
		written = append(written, uploaded{Name: filepath.Base(path), Type: "file", Path: path})
	case "multipart/form-data":
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextRawPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeHTTPError(w, http.StatusBadRequest, fmt.Errorf("multipart body: %w", err))
				return
			}
			if part.FormName() != "file" {
				continue
			}
			dest := q.Get("path")
			if dest == "" {
				// The raw file name: Part.FileName keeps only its last
				// element, and the SDK sends the whole path there.
				_, disp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				dest = disp["filename"]
			}
			if dest == "" {
				writeHTTPError(w, http.StatusBadRequest, errors.New("path: required (no path parameter and a part without a file name)"))
				return
			}
			path := user.abs(dest)
			if status, err := writeFile(user, path, part); err != nil {
				writeHTTPError(w, status, err)
				return
			}
			written = append(written, uploaded{Name: filepath.Base(path), Type: "file", Path: path})
		}
	default:
		writeHTTPError(w, http.StatusBadRequest, fmt.Errorf("content-type %q: want multipart/form-data or application/octet-stream", ct))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(written)
}

// writeFile replaces path's content with r's, making its directories;
// on failure it returns the HTTP status saying why.
func writeFile(user identity, path string, r io.Reader) (int, error) {
	if err := makeDirs(user, filepath.Dir(path)); err != nil {
		return fileStatus(err), fmt.Errorf("write %s: its directory: %w", path, err)
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return http.StatusBadRequest, fmt.Errorf("write %s: a directory, not a file", path)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fileStatus(err), fmt.Errorf("write %s: %w", path, err)
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fileStatus(err), fmt.Errorf("write %s: %w", path, err)
	}
	if err := user.own(path); err != nil {
		return fileStatus(err), fmt.Errorf("write %s: give it to %s: %w", path, user.name, err)
	}
	return http.StatusOK, nil
}

// fileStatus is the HTTP status of a failed file operation, those the
// SDK maps: 404 to a missing file, 507 to a full disk.
func fileStatus(err error) int {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return http.StatusNotFound
	case errors.Is(err, fs.ErrPermission):
		return http.StatusForbidden
	case errors.Is(err, syscall.ENOSPC):
		return http.StatusInsufficientStorage
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

func writeFileError(w http.ResponseWriter, op, path string, err error) {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = fmt.Errorf("%s %s: %w", op, path, pe.Err)
	}
	writeHTTPError(w, fileStatus(err), err)
}
