package wire

// Unhex returns the value of the hexadecimal digit c (0-9, a-f, A-F), or -1
// for any other byte. Both HTTP/1.1 chunk-size parsers use it: the proxy's
// (relaying a worker's chunked body) and loadgen's (framing responses).
func Unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
