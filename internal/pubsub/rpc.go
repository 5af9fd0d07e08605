package pubsub

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
)

// Message is one fastapi_websocket_rpc frame (opal-protocol §2.2). Both keys
// are always written, the unused one as null, because the Python side does
// the same; a missing key reads as null.
type Message struct {
	Request  *Request  `json:"request"`
	Response *Response `json:"response"`
}

// Request is an RPC call. Arguments is a JSON object of keyword arguments.
type Request struct {
	Method    string          `json:"method"`
	Arguments json.RawMessage `json:"arguments"`
	CallID    string          `json:"call_id"`
}

// Response answers the Request with the same CallID.
type Response struct {
	Result     json.RawMessage `json:"result"`
	ResultType string          `json:"result_type"`
	CallID     string          `json:"call_id"`
}

// NewCallID returns 32 lowercase hex digits, like Python's uuid4().hex.
func NewCallID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// NewRequest builds a request frame. A nil args marshals as {} (§2.2: the
// arguments default to an empty object, never null).
func NewRequest(method string, args any) ([]byte, string, error) {
	raw := json.RawMessage("{}")
	if args != nil {
		b, err := json.Marshal(args)
		if err != nil {
			return nil, "", err
		}
		raw = b
	}
	id := NewCallID()
	b, err := json.Marshal(Message{Request: &Request{Method: method, Arguments: raw, CallID: id}})
	return b, id, err
}

// NewResponse builds a response frame for callID.
func NewResponse(callID string, result any, resultType string) ([]byte, error) {
	r, err := json.Marshal(result)
	if err != nil {
		return nil, err
	}
	return json.Marshal(Message{Response: &Response{Result: r, ResultType: resultType, CallID: callID}})
}
