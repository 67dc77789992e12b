// Package netloop is a small epoll event loop for the pinboard's data plane:
// non-blocking sockets driven by one goroutine per loop, with no goroutine,
// channel, lock or allocation per event. It knows nothing of HTTP.
//
// # Why it exists
//
// Go's network stack parks a goroutine on every read that finds nothing,
// and wakes it through the runtime's netpoller and scheduler: on a proxy
// that is two reads per message where one would do (the second returns
// EAGAIN), and thread hand-offs (futex wake-ups, context switches) between
// the goroutines of the two legs of an exchange. A loop that owns both legs
// reads when epoll says a socket is readable, treats a short read as "drained
// until the next edge", and runs every step of an exchange on one thread.
//
// # How it runs
//
// A Loop is one epoll instance and the goroutine that calls Run. File
// descriptors are registered edge-triggered for reading and writing (Add);
// the loop calls the Handler's OnEvent with the events epoll reported. Timers
// (Timer, Arm, Disarm) live on a hashed wheel of Tick-wide slots in the loop;
// Post hands a Task to the loop from any goroutine and wakes it through an
// eventfd. Every Handler, Timer and Task callback runs on the loop goroutine,
// one at a time, so state a loop owns needs no lock.
//
// The loop waits in epoll_wait as a system call the scheduler knows about:
// while it sleeps, its P can run other goroutines (after the runtime's usual
// hand-off delay), so a process may run as many loops as it has Ps and
// still serve its other goroutines. Reads, writes and a wait that cannot
// block (timeout 0) are raw system calls: on non-blocking descriptors they
// never block, and telling the scheduler would only cost time.
//
// # Invariants
//
//   - Callbacks run only on the loop goroutine, never concurrently, and never
//     after Run returned. Post is the only method other goroutines may call
//     (and Stop, Wake).
//   - A Token names one registration: the slot index and a generation, so an
//     event or a Del for a descriptor that was closed and whose slot was reused
//     never reaches the new owner.
//   - Timers fire at or after their deadline, within one Tick plus the time
//     the loop is busy; a disarmed timer never fires.
//   - Nothing here allocates per event, per timer or per Post once the slices
//     have grown to the loop's working size.
package netloop
