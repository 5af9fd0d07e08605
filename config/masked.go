package config

// Masked returns the configuration keyed by variable name, every variable
// read but the deprecated alias, with the secrets (ClientToken,
// PolicyStoreAuthToken) replaced by "***" when set and the URLs' user info,
// query values and fragments by "xxxxx".
func (c *Config) Masked() map[string]any {
	m := map[string]any{}
	for _, s := range settings {
		if s.parse == nil || s.show == nil {
			continue
		}
		v := s.show(c)
		if s.secret {
			v = mask(v.(string))
		}
		m[s.name] = v
	}
	return m
}
