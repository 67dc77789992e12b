package proxy

import "testing"

var benchTargets = [][]byte{
	[]byte("/counter/alice/incr"),
	[]byte("/chat/room-42/messages/since/1700000000?limit=50&order=desc"),
	[]byte("/c/" + "0123456789abcdef0123456789abcdef" + "/x/y/z"),
}

func BenchmarkParseRoute(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		for _, t := range benchTargets {
			if _, e := parseRoute(t, 0); e != routeOK {
				b.Fatal(e)
			}
		}
	}
}

// A browser-like request head.
var benchHead = []byte("Host: pinboard.example.com\r\n" +
	"User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n" +
	"Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n" +
	"Accept-Language: en-US,en;q=0.5\r\n" +
	"Accept-Encoding: gzip, deflate, br, zstd\r\n" +
	"Connection: keep-alive\r\n" +
	"Cookie: session=abcdef0123456789; theme=dark\r\n" +
	"Upgrade-Insecure-Requests: 1\r\n" +
	"Sec-Fetch-Dest: document\r\n" +
	"Sec-Fetch-Mode: navigate\r\n" +
	"\r\n")

func BenchmarkScanFields(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchHead)))
	var s headScan
	for b.Loop() {
		s.reset()
		scanFields(benchHead, &s, dropPinned|dropForwarded)
	}
}
