package wire

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// ParseAdvertiseURL splits a worker's advertise URL, "http://host[:port][/path]",
// into the address the proxy dials (host:port, port 80 when none is given)
// and the path prefix it puts in front of every forwarded path (the URL's
// escaped path without trailing slashes; "" for none). Anything else (another
// scheme, no host, user info, a query or a fragment) is an error: the proxy
// cannot reach such a worker. It is a pure function, shared by the placement
// resolver (which passes over sessions it cannot use) and the proxy (which
// dials addr).
func ParseAdvertiseURL(s string) (addr, pathPrefix string, err error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", "", fmt.Errorf("bad advertise URL %q: %w", s, err)
	}
	if u.Scheme != "http" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque != "" {
		return "", "", fmt.Errorf("advertise URL %q must be http://host:port[/path]", s)
	}
	addr = u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	// url.Parse lets some hosts through that are not dialable, such as "]":
	// what is returned must split back into a host and a port.
	if host, _, serr := net.SplitHostPort(addr); serr != nil || host == "" {
		return "", "", fmt.Errorf("advertise URL %q has no usable host: must be http://host:port[/path]", s)
	}
	return addr, strings.TrimRight(u.EscapedPath(), "/"), nil
}
