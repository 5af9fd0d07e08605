package agent

import (
	"net/http"

	"github.com/gorilla/websocket"
)

// withServerTLS gives the requests to the OPAL server and the data sources
// (Transport) and the pub/sub WebSocket (Dialer) the TLS configuration of
// OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED and
// OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE (config.ServerTLSConfig). An
// injected *http.Transport or Dialer with its own TLSClientConfig keeps it;
// another RoundTripper is the embedder's to configure. A CA file that cannot
// be read stops the start.
func withServerTLS(o Options) (Options, error) {
	tc, err := o.Config.ServerTLSConfig()
	if err != nil || tc == nil {
		return o, err
	}
	switch t := o.Transport.(type) {
	case nil:
		t2 := http.DefaultTransport.(*http.Transport).Clone()
		t2.TLSClientConfig = tc
		o.Transport = t2
	case *http.Transport:
		if t.TLSClientConfig == nil {
			t = t.Clone()
			t.TLSClientConfig = tc
			o.Transport = t
		}
	}
	if o.Dialer == nil || o.Dialer.TLSClientConfig == nil {
		d := *websocket.DefaultDialer
		if o.Dialer != nil {
			d = *o.Dialer
		}
		d.TLSClientConfig = tc
		o.Dialer = &d
	}
	return o, nil
}
