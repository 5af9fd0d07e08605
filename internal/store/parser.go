// This file is the parser cache: a module is parsed once per (id, text), so a
// one-module delta does not re-parse the whole module set.

package store

import "github.com/open-policy-agent/opa/v1/ast"

// Parser parses modules and keeps the parsed form of each (id, text), so a
// one-module delta re-parses one module, not the whole set.
type Parser struct {
	Options ast.ParserOptions
	cache   map[string]parsed
}

type parsed struct {
	raw string
	mod *ast.Module
}

// Parse returns the parsed module for id with the given text.
func (ps *Parser) Parse(id, raw string) (*ast.Module, error) {
	if c, ok := ps.cache[id]; ok && c.raw == raw {
		return c.mod, nil
	}
	m, err := ast.ParseModuleWithOpts(id, raw, ps.Options)
	if err != nil {
		if errs, ok := err.(ast.Errors); ok {
			return nil, &CompileError{Errors: errs}
		}
		return nil, &CompileError{Errors: ast.Errors{ast.NewError(ast.ParseErr, nil, "%s: %v", id, err)}}
	}
	if m == nil {
		return nil, &CompileError{Errors: ast.Errors{ast.NewError(ast.ParseErr, nil, "%s: empty module", id)}}
	}
	if ps.cache == nil {
		ps.cache = map[string]parsed{}
	}
	ps.cache[id] = parsed{raw: raw, mod: m}
	return m, nil
}

// Cached returns how many parsed modules the cache holds.
func (ps *Parser) Cached() int { return len(ps.cache) }

// Forget drops ids no longer in the store from the cache.
func (ps *Parser) Forget(keep func(id string) bool) {
	for id := range ps.cache {
		if !keep(id) {
			delete(ps.cache, id)
		}
	}
}

// Result returns the module set after the plan: current plus the upserts,
// minus the deletes, all parsed.
func (ps *Parser) Result(p *Plan, current map[string]*ast.Module) (map[string]*ast.Module, error) {
	out := make(map[string]*ast.Module, len(current)+len(p.Upserts))
	for id, m := range current {
		if m != nil { // a remote module that does not parse here
			out[id] = m
		}
	}
	for _, um := range p.Upserts {
		m, err := ps.Parse(um.Path, um.Rego)
		if err != nil {
			return nil, err
		}
		out[um.Path] = m
	}
	for _, id := range p.Deletes {
		delete(out, id)
	}
	return out, nil
}
