// Package arch holds no code: its tests check the repository's import
// rules, the seams docs/architecture.md describes, that no Go file that
// is not generated outgrows one concern (700 lines), and that the listed
// packages start no goroutine without an owner.
package arch
