package netloop

import (
	"errors"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The socket calls below are raw system calls: on non-blocking descriptors
// they never block, so telling the scheduler (entersyscall/exitsyscall) would
// only cost time. Errors are unix.Errno values; EAGAIN means "would block".

// Read reads from fd into b. It returns the number of bytes read, 0 at end of
// stream, or an error (unix.EAGAIN when nothing is there).
func Read(fd int, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// Write writes b to fd and returns how much the kernel took (unix.EAGAIN
// when nothing could be written).
func Write(fd int, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// Close closes fd.
func Close(fd int) error {
	_, _, e := unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// ShutdownWrite shuts the sending side of the socket fd down (the peer
// reads end of stream once what was written has gone); reading goes on.
func ShutdownWrite(fd int) error {
	_, _, e := unix.RawSyscall(unix.SYS_SHUTDOWN, uintptr(fd), unix.SHUT_WR, 0)
	if e != 0 {
		return e
	}
	return nil
}

// Accept accepts one connection on the non-blocking listening socket lfd. The
// new descriptor is non-blocking and close-on-exec; peer is the client's
// address (unmapped from IPv4-in-IPv6). It does not allocate.
func Accept(lfd int) (fd int, peer netip.AddrPort, err error) {
	var rsa unix.RawSockaddrAny
	l := uint32(unsafe.Sizeof(rsa))
	r, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(lfd), uintptr(unsafe.Pointer(&rsa)),
		uintptr(unsafe.Pointer(&l)), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
	if e != 0 {
		return -1, netip.AddrPort{}, e
	}
	return int(r), addrPort(&rsa), nil
}

func addrPort(rsa *unix.RawSockaddrAny) netip.AddrPort {
	switch rsa.Addr.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(p[0])<<8|uint16(p[1]))
	case unix.AF_INET6:
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(p[0])<<8|uint16(p[1]))
	}
	return netip.AddrPort{}
}

// SetNoDelay turns Nagle's algorithm off on a TCP socket, as Go's net package
// does for every TCP connection.
func SetNoDelay(fd int) error {
	return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
}

// SocketError returns the pending error of a socket (SO_ERROR), which tells
// whether a non-blocking connect succeeded once the socket is writable.
func SocketError(fd int) error {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return err
	}
	if v != 0 {
		return syscall.Errno(v)
	}
	return nil
}

// epollWait waits for events: it returns at once when events are ready,
// when msec (-1: no limit) has passed, or when a signal arrives (EINTR,
// reported as n = 0). A wait that may block tells the scheduler (see the
// package doc); a poll (msec 0) does not.
func epollWait(epfd int, events []unix.EpollEvent, msec int) (int, error) {
	call := unix.Syscall6
	if msec == 0 {
		call = unix.RawSyscall6
	}
	r, _, e := call(unix.SYS_EPOLL_WAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])),
		uintptr(len(events)), uintptr(msec), 0, 0)
	if e != 0 {
		if e == unix.EINTR {
			return 0, nil
		}
		return 0, e
	}
	return int(r), nil
}

func epollCtl(epfd, op, fd int, ev *unix.EpollEvent) error {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd),
		uintptr(unsafe.Pointer(ev)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// Dup returns a close-on-exec duplicate of the descriptor of c (a
// *net.TCPConn, *net.TCPListener or anything else with SyscallConn), set
// non-blocking. The caller owns it and closes it with Close; c stays open and
// is the caller's to close as well. It is how a connection dialled or a
// listener bound by the net package moves to a loop.
func Dup(c syscall.Conn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) {
		fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, derr
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = Close(fd)
		return -1, err
	}
	return fd, nil
}

// DupListener is Dup for a listener.
func DupListener(ln any) (int, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return -1, errors.New("netloop: listener has no file descriptor")
	}
	return Dup(sc)
}
