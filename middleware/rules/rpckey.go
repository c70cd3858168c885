package rules

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/flightlock/flightlock"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// RPCKeyFunc is KeyFunc's zrpc twin, for WithRPCRule: req is the request message (the first
// message of a client stream), and a bad key answers InvalidArgument.
type RPCKeyFunc func(ctx context.Context, req any) (string, error)

// rpcSource is one call as seen by the key getters.
type rpcSource struct {
	ctx context.Context
	req any
}

// bindRPC binds a template reference to its zrpc getter: {header.x} reads the incoming
// metadata, anything else is a field path of the request message, checked at start-up against
// input when the method's descriptor is registered.
func bindRPC(input protoreflect.MessageDescriptor) func(ref string) (getter[rpcSource], error) {
	return func(ref string) (getter[rpcSource], error) {
		if name, ok := strings.CutPrefix(ref, "header."); ok {
			name = strings.ToLower(name)
			// Different values are refused, as in REST: which one the handler reads is unknown.
			return func(s rpcSource) (string, bool, error) {
				md, _ := metadata.FromIncomingContext(s.ctx)
				var c candidates
				c.add(slices.DeleteFunc(slices.Clone(md.Get(name)), func(v string) bool { return v == "" }), "the metadata")
				return c.one(ref, "send one value")
			}, nil
		}
		path := strings.Split(ref, ".")
		if input != nil {
			if err := checkFieldPath(input, path); err != nil {
				return nil, fmt.Errorf("{%s}: %v", ref, err)
			}
		}
		return func(s rpcSource) (string, bool, error) {
			msg, ok := s.req.(proto.Message)
			if !ok || msg == nil {
				return "", false, nil
			}
			v, ok := fieldValue(msg.ProtoReflect(), path)
			return v, ok, nil
		}, nil
	}
}

// usesMessage reports whether a template reads the request message.
func usesMessage(keys []TemplateKey) bool {
	return slices.ContainsFunc(keys, func(k TemplateKey) bool {
		return slices.ContainsFunc(k.Refs, func(ref string) bool { return !strings.HasPrefix(ref, "header.") })
	})
}

// methodInput returns a full method's request message descriptor, if its proto is registered.
func methodInput(fullMethod string) protoreflect.MessageDescriptor {
	svc, method, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	d, _ := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc + "." + method))
	if md, ok := d.(protoreflect.MethodDescriptor); ok {
		return md.Input()
	}
	return nil
}

// checkFieldPath makes sure path names singular message fields down to a singular scalar.
func checkFieldPath(md protoreflect.MessageDescriptor, path []string) error {
	for i, name := range path {
		fd := md.Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			return unknownField(md, name)
		}
		if fd.IsList() || fd.IsMap() {
			return fmt.Errorf("%s.%s is repeated: a key needs a single value", md.FullName(), name)
		}
		last := i == len(path)-1
		isMsg := fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind
		switch {
		case last && isMsg:
			return fmt.Errorf("%s.%s is a message: name one of its fields", md.FullName(), name)
		case !last && !isMsg:
			return fmt.Errorf("%s.%s is not a message", md.FullName(), name)
		case !last:
			md = fd.Message()
		}
	}
	return nil
}

// unknownField is the error of a field md lacks, listing md's proto field names and the one
// probably meant when written the Go or JSON way (AccountId).
func unknownField(md protoreflect.MessageDescriptor, name string) error {
	fields := md.Fields()
	names := make([]string, 0, fields.Len())
	var near string
	for i := range fields.Len() {
		fd := fields.Get(i)
		names = append(names, string(fd.Name()))
		if fold(string(fd.Name())) == fold(name) || fd.JSONName() == name {
			near = string(fd.Name())
		}
	}
	hint := ""
	if near != "" {
		hint = fmt.Sprintf("did you mean {%s}? ", near)
	}
	return fmt.Errorf("%s has no field %q (%skey templates name fields by their proto names: %s)",
		md.FullName(), name, hint, strings.Join(names, ", "))
}

// fold is a field name without case and underscores: AccountId, account_id fold alike.
func fold(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }

// fieldValue reads a field path of m. A field not set (without presence, one at its zero
// value) is missing, so that requests lacking it do not all share a key like "order:0".
func fieldValue(m protoreflect.Message, path []string) (string, bool) {
	for i, name := range path {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
		if fd == nil || fd.IsList() || fd.IsMap() || !m.Has(fd) {
			return "", false
		}
		if i == len(path)-1 {
			return scalarField(fd, m.Get(fd))
		}
		if fd.Message() == nil {
			return "", false // a scalar where the path goes on
		}
		m = m.Get(fd).Message()
	}
	return "", false
}

// scalarField renders a singular scalar field: numbers as Value.String writes them, enums by name.
func scalarField(fd protoreflect.FieldDescriptor, v protoreflect.Value) (string, bool) {
	switch fd.Kind() {
	case protoreflect.BytesKind:
		return string(v.Bytes()), true
	case protoreflect.BoolKind:
		// As REST renders a bool (canonicalValue): one template locks one entity in both.
		if v.Bool() {
			return "1", true
		}
		return "0", true
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return string(ev.Name()), true
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return "", false
	}
	return v.String(), true
}

// userKey checks a KeyFunc's or RPCKeyFunc's key: its errors and an empty key are ErrInvalidKey.
func userKey(key string, err error) ([]string, error) {
	if err != nil {
		if !errors.Is(err, flightlock.ErrInvalidKey) {
			err = fmt.Errorf("%w: %w", flightlock.ErrInvalidKey, err)
		}
		return nil, err
	}
	if key == "" {
		return nil, fmt.Errorf("%w: empty key", flightlock.ErrInvalidKey)
	}
	return []string{key}, nil
}
