package redistest

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// clusterReadyTimeout bounds how long a new cluster may take to agree on
// its slots.
const clusterReadyTimeout = 20 * time.Second

// Cluster is a local Redis Cluster owned by a test: three masters (no
// replicas) on free 127.0.0.1 ports, each serving a third of the slots,
// persistence off.
type Cluster struct {
	// Nodes are the masters, in slot order.
	Nodes []*Server
	// URL names every node as a seed, in the form rueidis.ParseURL reads:
	// redis://<node1>?addr=<node2>&addr=<node3>.
	URL string
}

// StartCluster starts a three-master cluster (redis-server
// --cluster-enabled yes, joined by FormCluster, no redis-cli needed) and
// returns once every node reports cluster_state:ok with all slots assigned
// and every node known: about two seconds, the delay a master waits after
// its start before it takes writes (CLUSTER_WRITABLE_DELAY in Redis). The
// nodes are killed when the test ends.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	const n = 3
	c := &Cluster{}
	var addrs []string
	for range n {
		s := Start(tb, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000")
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr)
	}
	c.URL = ClusterURL(addrs)
	if err := FormCluster(addrs); err != nil {
		tb.Fatal(err)
	}
	return c
}

// ClusterURL names every node of a cluster as a seed, in the form
// rueidis.ParseURL reads: redis://<node1>?addr=<node2>&addr=<node3>.
func ClusterURL(addrs []string) string {
	u := "redis://" + addrs[0]
	for i, a := range addrs[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + a
	}
	return u
}

// FormCluster makes one cluster of the empty cluster-enabled redis-servers
// at addrs (started with --cluster-enabled yes, by a test or by bench):
// each node serves an equal share of the slots (CLUSTER ADDSLOTS), the
// first meets the others (CLUSTER MEET), and it returns once every node
// reports cluster_state:ok with all slots assigned and every node known, or
// an error after clusterReadyTimeout.
func FormCluster(addrs []string) error {
	n := len(addrs)
	for i, a := range addrs {
		args := []string{"CLUSTER", "ADDSLOTS"}
		for slot := i * clusterSlots / n; slot < (i+1)*clusterSlots/n; slot++ {
			args = append(args, strconv.Itoa(slot))
		}
		if _, err := Command(a, args...); err != nil {
			return fmt.Errorf("cluster node %s: %w", a, err)
		}
	}
	for _, a := range addrs[1:] {
		host, port, _ := net.SplitHostPort(a)
		if _, err := Command(addrs[0], "CLUSTER", "MEET", host, port); err != nil {
			return fmt.Errorf("cluster meet %s: %w", a, err)
		}
	}
	deadline := time.Now().Add(clusterReadyTimeout)
	for _, a := range addrs {
		for {
			info, err := Command(a, "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_slots_assigned:"+strconv.Itoa(clusterSlots)) &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("redis cluster not ready after %v: node %s: %q, %v", clusterReadyTimeout, a, info, err)
			}
			time.Sleep(20 * time.Millisecond) // gossip has no event to wait on
		}
	}
	return nil
}

// Each runs one command on every node (FLUSHALL, CLIENT KILL ...) and fails
// the test on the first error.
func (c *Cluster) Each(tb testing.TB, args ...string) {
	tb.Helper()
	for _, s := range c.Nodes {
		if _, err := s.Command(args...); err != nil {
			tb.Fatalf("%s on %s: %v", strings.Join(args, " "), s.Addr, err)
		}
	}
}

// commandTimeout bounds one Command.
const commandTimeout = 5 * time.Second

// Command sends one command to the server on a fresh connection and returns
// its reply as the package function Command does.
func (s *Server) Command(args ...string) (string, error) { return Command(s.Addr, args...) }

// Client returns a rueidis client for url (a Server's or a Cluster's URL)
// without client-side caching, closed when the test ends.
func Client(tb testing.TB, url string) rueidis.Client {
	tb.Helper()
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		tb.Fatal(err)
	}
	opt.DisableCache = true
	c, err := rueidis.NewClient(opt)
	if err != nil {
		tb.Fatalf("redis client for %s: %v", url, err)
	}
	tb.Cleanup(c.Close)
	return c
}
