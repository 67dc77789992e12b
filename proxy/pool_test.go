package proxy

import (
	"context"
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// noResolver routes nothing.
type noResolver struct{}

func (noResolver) Lookup([]byte, time.Time) (Route, bool)         { return Route{}, false }
func (noResolver) Resolve(context.Context, []byte) (Route, error) { return Route{}, ErrNoWorker }
func (noResolver) Refused([]byte, Route, string)                  {}

// Every field of a pooled exchange is reset when the exchange goes back to
// its pool, but those its put function names as kept (the exchange's own
// identity, buffers that keep their capacity but lose their length, and
// parsed heads and scans reset where they are filled): each other field is
// set to a non-zero value, the exchange is put back and taken again, and
// every such field must be zero (or its documented "none": dfd is -1). A
// field added without a reset fails here.
func TestPooledExchangesComeBackClean(t *testing.T) {
	p, err := New(Config{Resolver: noResolver{}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := p.NewFront(FrontConfig{Loops: 1, Fallback: p.NewServer()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Shutdown(t.Context()) }()

	t.Run("loop", func(t *testing.T) {
		lp := f.loops[0]
		x := lp.getExchange()
		self := x.lp
		keep := map[string]bool{
			"lp": true, "stripe": true, "timer": true, // x's own
			"req": true, "resp": true, "scan": true, "rsc": true, "scratch": true, // reset where filled
			"st": true, // checked below: buffers inside
		}
		buffers := map[string]bool{"tgt": true, "uri": true, "body": true, "out": true}
		dirty(t, x, keep)
		dirty(t, &x.st, nil)
		x.lp = self
		lp.putExchange(x)
		if y := lp.getExchange(); y != x {
			t.Fatal("the free list did not give the exchange back")
		}
		assertClean(t, x, keep, buffers, map[string]any{"dfd": -1})
		assertClean(t, &x.st, nil, map[string]bool{"line": true, "trail": true}, nil)
	})
	t.Run("fasthttp", func(t *testing.T) {
		x := p.exchanges.Get().(*exchange)
		keep := map[string]bool{
			"p": true, "awaitFn": true, "stripe": true, "br": true, "bw": true, // x's own
			"reqScan": true, "respScan": true, "scratch": true, "streamBuf": true, // written before read
			"aux": true, // a fasthttp.Response, Reset on release (its pooled buffers stay)
		}
		buffers := map[string]bool{"tgt": true, "uri": true, "body": true}
		dirty(t, x, keep)
		x.aux.SetStatusCode(599)
		x.aux.Header.Set("X-Stale", "1")
		p.putExchange(x)
		assertClean(t, x, keep, buffers, nil)
		if x.aux.StatusCode() != fasthttp.StatusOK || len(x.aux.Header.Peek("X-Stale")) != 0 {
			t.Errorf("aux kept the last response: %d, X-Stale %q", x.aux.StatusCode(), x.aux.Header.Peek("X-Stale"))
		}
	})
}

// dirtyConn is a value for pooledConn fields.
type dirtyConn struct{}

func (dirtyConn) Conn() net.Conn         { return nil }
func (dirtyConn) CreatedTime() time.Time { return time.Time{} }

// dirtyImpls are the values dirty puts in interface fields: the first that
// implements the field's type.
var dirtyImpls = []any{errors.New("dirty"), (*net.TCPConn)(nil), (*strings.Reader)(nil), dirtyConn{}}

// dirty sets every field of the struct v points to, but those in keep, to
// a non-zero value.
func dirty(t *testing.T, v any, keep map[string]bool) {
	t.Helper()
	s := reflect.ValueOf(v).Elem()
	for i := range s.NumField() {
		name := s.Type().Field(i).Name
		if keep[name] {
			continue
		}
		f := reflect.NewAt(s.Field(i).Type(), unsafe.Pointer(s.Field(i).UnsafeAddr())).Elem()
		setNonZero(t, name, f)
	}
}

func setNonZero(t *testing.T, name string, f reflect.Value) {
	t.Helper()
	switch f.Kind() {
	case reflect.Bool:
		f.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		f.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		f.SetUint(7)
	case reflect.Slice:
		s := reflect.MakeSlice(f.Type(), 1, 1)
		setNonZero(t, name, s.Index(0))
		f.Set(s)
	case reflect.Pointer:
		f.Set(reflect.New(f.Type().Elem()))
	case reflect.Interface:
		for _, impl := range dirtyImpls {
			if v := reflect.ValueOf(impl); v.Type().Implements(f.Type()) {
				f.Set(v)
				return
			}
		}
		t.Fatalf("field %s: no dirty value for %s; add one to dirtyImpls", name, f.Type())
	case reflect.Struct:
		if f.Type() == reflect.TypeFor[time.Time]() {
			f.Set(reflect.ValueOf(time.Unix(7, 0)))
			return
		}
		for i := range f.NumField() {
			g := reflect.NewAt(f.Field(i).Type(), unsafe.Pointer(f.Field(i).UnsafeAddr())).Elem()
			setNonZero(t, name+"."+f.Type().Field(i).Name, g)
		}
	case reflect.Array:
		for i := range f.Len() {
			setNonZero(t, name, f.Index(i))
		}
	default:
		t.Fatalf("field %s: no dirty value for kind %s", name, f.Kind())
	}
}

// assertClean fails for every field of the struct v points to, but those in
// keep, that is not zero: buffers must have length 0, and a field in none
// must equal its value there.
func assertClean(t *testing.T, v any, keep, buffers map[string]bool, none map[string]any) {
	t.Helper()
	s := reflect.ValueOf(v).Elem()
	for i := range s.NumField() {
		name := s.Type().Field(i).Name
		f := reflect.NewAt(s.Field(i).Type(), unsafe.Pointer(s.Field(i).UnsafeAddr())).Elem()
		switch {
		case keep[name]:
		case buffers[name]:
			if f.Len() != 0 {
				t.Errorf("buffer %s kept %d bytes on release", name, f.Len())
			}
		case none[name] != nil:
			if got := f.Interface(); got != none[name] {
				t.Errorf("field %s = %v on release; want %v", name, got, none[name])
			}
		case !f.IsZero():
			t.Errorf("field %s (%s) is not reset on release", name, f.Type())
		}
	}
}
