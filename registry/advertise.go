package registry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// The advertise-URL policy (SSRF defence: the registry dials what workers
// advertise, so it must never be made to reach what an attacker chooses).
// An advertise URL names the only address the pinboard ever dials on a
// worker's say-so, so it is checked twice: when it is parsed (scheme,
// userinfo, query, fragment, port allow-list, numeric-obfuscated hosts,
// metadata host names, and IP literals against the address rules) and at
// dial time, after DNS, on the exact address being connected
// (net.Dialer.Control), so a name that resolves, or later re-resolves
// (DNS rebinding), into a refused range is never reached.
//
// Address rules, applied to the address with any IPv4-in-IPv6 mapping
// removed (::ffff:169.254.169.254 is 169.254.169.254):
//
//   - never: the unspecified addresses (0.0.0.0, ::) and the cloud metadata
//     endpoints (169.254.169.254, 169.254.170.2, 169.254.170.23,
//     fd00:ec2::254, 100.100.100.200), whatever the allow-list says;
//   - refused by default: the IANA special-purpose ranges listed in
//     specialRanges (link-local 169.254/16 and fe80::/10, shared address
//     space 100.64/10, multicast, reserved, documentation, benchmarking,
//     NAT64, 6to4, Teredo, deprecated site-local and IPv4-compatible). An
//     allow-list entry that lies inside such a range opts into it (e.g.
//     100.64.0.0/10 for a Tailscale network); a broader entry (0.0.0.0/0)
//     does not;
//   - allowed by default: loopback (dev), RFC 1918, IPv6 unique local
//     (fc00::/7) and public addresses. A non-empty allow-list
//     (Config.AdvertiseNetworks) narrows this to its entries.

// metadataHosts are host names of cloud metadata services. They are refused
// at parse time whatever they resolve to (lower case, no trailing dot).
var metadataHosts = []string{
	"metadata",
	"metadata.google.internal",
	"metadata.goog",
	"metadata.azure.internal",
	"instance-data",
	"instance-data.ec2.internal",
	"metadata.tencentyun.com",
	"metadata.platformequinix.com",
}

// neverAddrs are refused whatever the allow-list says: cloud metadata
// endpoints.
var neverAddrs = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack, ...
	netip.MustParseAddr("169.254.170.2"),   // AWS ECS task metadata
	netip.MustParseAddr("169.254.170.23"),  // AWS EKS pod identity
	netip.MustParseAddr("fd00:ec2::254"),   // AWS IMDS over IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
}

// specialRange is an IANA special-purpose range refused by default.
type specialRange struct {
	p    netip.Prefix
	what string
}

var specialRanges = []specialRange{
	{netip.MustParsePrefix("0.0.0.0/8"), "a \"this network\" address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared (carrier-grade NAT) address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol assignment"},
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved or broadcast address"},
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible IPv6 address"},
	{netip.MustParsePrefix("64:ff9b::/96"), "a NAT64 address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a NAT64 address"},
	{netip.MustParsePrefix("100::/64"), "a discard-only address"},
	{netip.MustParsePrefix("2001::/23"), "an IETF protocol assignment (Teredo, ...)"},
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation address"},
	{netip.MustParsePrefix("2002::/16"), "a 6to4 address"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
}

// errNetworkNotAllowed is returned (wrapped) by the dialer's Control hook
// and by addrPolicy.check.
var errNetworkNotAllowed = errors.New("address not allowed for an advertise URL")

// addrPolicy decides which advertise URLs and addresses the registry
// accepts. The zero value applies the defaults.
type addrPolicy struct {
	allow []netip.Prefix // empty: every address the defaults allow
	ports []uint16       // empty: any port
}

// newAddrPolicy validates the allow-list (IPv4-mapped prefixes are turned
// into plain IPv4 ones, since addresses are checked unmapped).
func newAddrPolicy(allow []netip.Prefix, ports []uint16) (*addrPolicy, error) {
	p := &addrPolicy{ports: slices.Clone(ports)}
	for _, a := range allow {
		if !a.IsValid() {
			return nil, errors.New("Config.AdvertiseNetworks holds an invalid prefix")
		}
		if a.Addr().Is4In6() && a.Bits() >= 96 {
			a = netip.PrefixFrom(a.Addr().Unmap(), a.Bits()-96)
		}
		p.allow = append(p.allow, a.Masked())
	}
	for _, port := range ports {
		if port == 0 {
			return nil, errors.New("Config.AdvertisePorts holds port 0")
		}
	}
	return p, nil
}

// check reports why a is not an address advertise URLs may use, or nil.
func (p *addrPolicy) check(a netip.Addr) error {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return fmt.Errorf("%w: invalid address", errNetworkNotAllowed)
	case a.Zone() != "":
		return fmt.Errorf("%w: %s has a zone", errNetworkNotAllowed, a)
	case a.IsUnspecified():
		return fmt.Errorf("%w: %s is the unspecified address", errNetworkNotAllowed, a)
	case slices.Contains(neverAddrs, a):
		return fmt.Errorf("%w: %s is a cloud metadata address", errNetworkNotAllowed, a)
	}
	if !a.IsLoopback() {
		for _, s := range specialRanges {
			if !s.p.Contains(a) {
				continue
			}
			for _, al := range p.allow {
				// An allow-list entry inside the special range opts in.
				if al.Contains(a) && al.Bits() >= s.p.Bits() && s.p.Contains(al.Addr()) {
					return nil
				}
			}
			return fmt.Errorf("%w: %s is %s, refused unless the pinboard's advertise networks list that range", errNetworkNotAllowed, a, s.what)
		}
	}
	if len(p.allow) == 0 {
		return nil
	}
	for _, al := range p.allow {
		if al.Contains(a) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s is outside the pinboard's advertise networks", errNetworkNotAllowed, a)
}

// checkURL applies the parse-time rules to a canonical advertise URL: the
// port allow-list, metadata host names, and the address rules for an IP
// literal. Host names are checked again, address by address, at dial time.
func (p *addrPolicy) checkURL(canon string) error {
	addr, _ := hostPort(canon)
	host, portStr, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portStr)
	if len(p.ports) > 0 && !slices.Contains(p.ports, uint16(port)) {
		return fmt.Errorf("port %d is not in the pinboard's allowed advertise ports %v", port, p.ports)
	}
	if slices.Contains(metadataHosts, host) {
		return fmt.Errorf("%q is a cloud metadata host name", host)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return p.check(ip)
	}
	return nil
}

// control is the net.Dialer.Control hook: it runs after DNS resolution for
// every address the dialer tries, on that exact address.
func (p *addrPolicy) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot parse %q", errNetworkNotAllowed, address)
	}
	return p.check(ap.Addr())
}

// checkHost validates the host part of an advertise URL (lower-cased, no
// brackets, no trailing dot): an IP literal in its canonical form, or a DNS
// name whose labels are letters, digits, '-' and '_' (1–63 bytes each) and
// whose last label is not numeric, so numeric-obfuscated addresses such as
// 2130706433, 0177.0.0.1, 0x7f.1 or 127.1 (which some resolvers read as
// 127.0.0.1) are refused. It returns the canonical host.
func checkHost(host string) (string, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return "", errors.New("has an IPv6 zone")
		}
		return ip.String(), nil
	}
	if len(host) > 253 {
		return "", errors.New("host name longer than 253 bytes")
	}
	labels := strings.Split(host, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return "", errors.New("has an invalid host name (empty or over-long label)")
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("host name contains %q", c)
			}
		}
	}
	last := labels[len(labels)-1]
	numeric := strings.HasPrefix(last, "0x")
	if !numeric {
		numeric = strings.Trim(last, "0123456789") == ""
	}
	if numeric {
		return "", errors.New("host looks like a numeric IP address in a non-canonical form (write it as a.b.c.d or [v6])")
	}
	return host, nil
}

// DialControl is a net.Dialer.Control hook applying the registry's address
// rules (the defaults and Config.AdvertiseNetworks) to the exact address
// being connected. The data plane dials workers through it, so a worker's
// advertise URL can never lead the proxy to an address the registry
// refuses, even when its name re-resolves elsewhere after registration. Its
// errors wrap a sentinel the caller need not know: any error means "do not
// connect".
func (r *Registry) DialControl(network, address string, c syscall.RawConn) error {
	return r.policy.control(network, address, c)
}

// resolver looks a host name up; the default is net.DefaultResolver.
type resolver func(ctx context.Context, host string) ([]netip.Addr, error)

func defaultResolve(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}
