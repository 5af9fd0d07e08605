// This file is the compile-before-write check: a bundle whose resulting
// module set does not compile is refused before anything is written.

package store

import "github.com/open-policy-agent/opa/v1/ast"

// CompileError is a bundle whose resulting module set does not parse or
// compile. Nothing was written.
type CompileError struct {
	Errors ast.Errors
}

// Compile compiles a complete module set as OPA's server does on PUT
// /v1/policies. conflicts, if not nil, reports data paths that are not empty
// (rule/data conflicts fail the compile).
func Compile(modules map[string]*ast.Module, conflicts func([]string) (bool, error)) (*ast.Compiler, error) {
	return CompileWith(modules, conflicts, CompileOptions{})
}

// CompileOptions are the compiler settings OPA's own loader uses.
type CompileOptions struct {
	// RegoVersion is the version of modules that declare none: ast.RegoV0
	// under --v0-compatible; the zero value is OPA's default (v1).
	RegoVersion ast.RegoVersion
	// EnablePrintStatements keeps print() calls (OPA does at log level info).
	EnablePrintStatements bool
}

// CompileWith is Compile with OPA's compiler settings.
func CompileWith(modules map[string]*ast.Module, conflicts func([]string) (bool, error), o CompileOptions) (*ast.Compiler, error) {
	c := ast.NewCompiler().WithEnablePrintStatements(o.EnablePrintStatements)
	if o.RegoVersion != ast.RegoUndefined {
		c = c.WithDefaultRegoVersion(o.RegoVersion)
	}
	if conflicts != nil {
		c = c.WithPathConflictsCheck(conflicts)
	}
	if c.Compile(modules); c.Failed() {
		return nil, &CompileError{Errors: c.Errors}
	}
	return c, nil
}
