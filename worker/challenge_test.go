package worker

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// getChallenge fetches the challenge endpoint over the real listener.
func getChallenge(t *testing.T, h *harness, method, challenge string, secret *string) (int, string, string) {
	t.Helper()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	u := h.w.AdvertiseURL() + wire.PathChallenge
	if challenge != "" {
		u += "?" + wire.QueryChallenge + "=" + url.QueryEscape(challenge)
	}
	req.SetRequestURI(u)
	req.Header.SetMethod(method)
	if secret != nil {
		req.Header.Set(wire.HeaderProxySecret, *secret)
	}
	if err := h.pb.client.DoTimeout(req, resp, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode(), string(resp.Header.Peek(wire.HeaderReason)), string(resp.Body())
}

func TestChallengeEndpoint(t *testing.T) {
	h := newHarness(t)
	live := newChallengePair()
	h.w.challenges.add(live)
	secret := string(h.w.secret)
	wrong := "not-the-secret"
	almost := secret[:len(secret)-1] + "x"
	empty := ""

	f := func(name, method, challenge string, sec *string, wantStatus int, wantReason string) {
		t.Run(name, func(t *testing.T) {
			status, reason, body := getChallenge(t, h, method, challenge, sec)
			if status != wantStatus || reason != wantReason {
				t.Fatalf("%s %s = %d (reason %q); want %d (reason %q); body %s", method, name, status, reason, wantStatus, wantReason, body)
			}
			if strings.Contains(body, secret) {
				t.Fatalf("the answer reveals the secret: %s", body)
			}
			if wantStatus != 200 {
				if strings.Contains(body, live.value) {
					t.Fatalf("a refused call got the challenge value: %s", body)
				}
				var e wire.Error
				if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == "" {
					t.Fatalf("body %q is not a JSON wire.Error", body)
				}
				return
			}
			var cr wire.ChallengeResponse
			if err := json.Unmarshal([]byte(body), &cr); err != nil || cr.Value != live.value {
				t.Fatalf("body %q; want {\"value\": %q}", body, live.value)
			}
		})
	}
	f("right secret, live challenge", "GET", live.challenge, &secret, 200, "")
	f("wrong secret", "GET", live.challenge, &wrong, 403, wire.ReasonForbidden)
	f("secret off by one byte", "GET", live.challenge, &almost, 403, wire.ReasonForbidden)
	f("empty secret", "GET", live.challenge, &empty, 403, wire.ReasonForbidden)
	f("no secret", "GET", live.challenge, nil, 403, wire.ReasonForbidden)
	f("wrong secret, no challenge", "GET", "", &wrong, 403, wire.ReasonForbidden)
	f("no challenge", "GET", "", &secret, 400, "")
	f("unknown challenge", "GET", "nope", &secret, 404, "")
	f("POST", "POST", live.challenge, &secret, 405, "")

	h.w.challenges.remove(live.challenge)
	f("stale challenge", "GET", live.challenge, &secret, 404, "")
}

// The pinboard proves the registration's challenge during the call; once the
// call returned, the same challenge is stale.
func TestChallengeLiveOnlyDuringItsCall(t *testing.T) {
	h := newHarness(t)
	h.register()
	h.advanceTo(3100 * time.Millisecond)
	if h.pb.fetchErrors != nil {
		t.Fatalf("the pinboard's challenge fetches failed: %v", h.pb.fetchErrors)
	}
	secret := string(h.w.secret)
	for _, c := range []string{h.pb.registerList()[0].req.Challenge, h.pb.heartbeatList()[0].req.Challenge} {
		if status, _, body := getChallenge(t, h, "GET", c, &secret); status != 404 {
			t.Fatalf("GET stale challenge %q = %d %s; want 404", c, status, body)
		}
	}
	if n := len(h.w.challenges.pairs); n != 0 {
		t.Fatalf("%d challenge pairs live with no call in flight; want 0", n)
	}
}

func FuzzHandleChallenge(f *testing.F) {
	w, err := New(Config{PinboardURL: "http://127.0.0.1:1", AdvertiseURL: "http://127.0.0.1:2", Token: "t"})
	if err != nil {
		f.Fatal(err)
	}
	live := challengePair{challenge: "live-challenge", value: "live-value"}
	w.challenges.add(live)
	f.Add("GET", "live-challenge", string(w.secret))
	f.Add("GET", "live-challenge", "")
	f.Add("HEAD", "x", "y")
	f.Fuzz(func(t *testing.T, method, challenge, secret string) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(method)
		ctx.Request.SetRequestURI(wire.PathChallenge + "?" + wire.QueryChallenge + "=" + url.QueryEscape(challenge))
		ctx.Request.Header.Set(wire.HeaderProxySecret, secret)
		w.HandleChallenge(&ctx)
		body := string(ctx.Response.Body())
		ok := ctx.Response.StatusCode() == 200
		wantOK := string(ctx.Request.Header.Method()) == "GET" && string(ctx.Request.Header.Peek(wire.HeaderProxySecret)) == string(w.secret) &&
			string(ctx.QueryArgs().Peek(wire.QueryChallenge)) == live.challenge
		if ok != wantOK {
			t.Fatalf("HandleChallenge(%q, %q, %q) = %d; want ok=%v", method, challenge, secret, ctx.Response.StatusCode(), wantOK)
		}
		if strings.Contains(body, string(w.secret)) || (!ok && strings.Contains(body, live.value)) {
			t.Fatalf("HandleChallenge leaked a secret: %s", body)
		}
	})
}
