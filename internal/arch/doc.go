// Package arch holds no code: its tests check the repository's import
// rules, the seams docs/architecture.md describes, and that no Go file
// that is not generated outgrows one concern (700 lines).
package arch
