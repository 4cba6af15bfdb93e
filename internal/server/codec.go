package server

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// strictJSON replaces connect's JSON codec, which drops fields it does not
// know: a field misspelled in a hand-written request ("idelPolicy") would
// be ignored and the request would succeed with a default the user never
// chose. Unknown fields are refused instead (InvalidArgument, naming the
// field). Binary protobuf requests stay lenient, as protobuf intends, so an
// older server keeps accepting a newer client's messages.
type strictJSON struct{ name string }

// strictJSONCodecs are registered under both names connect's JSON codec
// answers to, so they replace it for every content type.
func strictJSONCodecs() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(strictJSON{"json"}),
		connect.WithCodec(strictJSON{"json; charset=utf-8"}),
	}
}

func (c strictJSON) Name() string { return c.name }

func (strictJSON) IsBinary() bool { return false }

func (strictJSON) Marshal(msg any) ([]byte, error) {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal %T: not a protobuf message", msg)
	}
	return protojson.Marshal(m)
}

func (strictJSON) Unmarshal(data []byte, msg any) error {
	m, ok := msg.(proto.Message)
	if !ok {
		return fmt.Errorf("unmarshal into %T: not a protobuf message", msg)
	}
	if len(data) == 0 {
		return errors.New("an empty body is not a JSON object; send {} for an empty request")
	}
	// connect answers a codec error InvalidArgument; protojson's message
	// names the field and where it is ("unknown field \"x\"").
	if err := (protojson.UnmarshalOptions{}).Unmarshal(data, m); err != nil {
		return fmt.Errorf("request %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}
