// Package arch holds no code: its test checks the repository's import
// rules, the seams docs/architecture.md describes.
package arch
