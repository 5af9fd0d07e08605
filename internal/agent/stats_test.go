package agent

import (
	"testing"

	"github.com/opal-go/opal-client/config"
)

// TestStatistics_FromConfig: the announcement follows OPAL_STATISTICS_ENABLED,
// OPAL_CLIENT_STAT_ID and OPAL_STATISTICS_ADD_CLIENT_CHANNEL.
func TestStatistics_FromConfig(t *testing.T) {
	cases := []struct {
		name    string
		env     map[string]string
		want    bool
		id, top string
	}{
		{"off_by_default", nil, false, "", ""},
		{"on_with_defaults", map[string]string{"OPAL_STATISTICS_ENABLED": "true"}, true, "", "__opal_stats_add"},
		{"on_with_id_and_channel", map[string]string{"OPAL_STATISTICS_ENABLED": "1", "OPAL_CLIENT_STAT_ID": "pod-a",
			"OPAL_STATISTICS_ADD_CLIENT_CHANNEL": "stats_in"}, true, "pod-a", "stats_in"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.LoadFrom(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if err != nil {
				t.Fatal(err)
			}
			st := statistics(cfg)
			if (st != nil) != tc.want {
				t.Fatalf("statistics %+v, want enabled=%v", st, tc.want)
			}
			if st != nil && (st.ClientID != tc.id || st.Channel != tc.top) {
				t.Fatalf("statistics %+v, want id %q channel %q", st, tc.id, tc.top)
			}
		})
	}
}
