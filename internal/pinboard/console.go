package pinboard

import (
	"embed"
	"strings"

	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"
)

// consoleFiles is the operator console: one page, its script and its
// style sheet, served as they are (no build step, nothing from elsewhere).
//
//go:embed console/index.html console/console.js console/console.css
var consoleFiles embed.FS

// consoleCSP allows the page nothing but its own script, style sheet and
// calls to the listener it came from: no inline script, no other origin,
// no framing.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// mountConsole serves the console on the admin router: the page at /, its
// two assets, and every /registry/* call handed to the registry's own
// handler in process (same routes, same bearer-token check, same limits as
// on the public port), which is what the page calls.
func mountConsole(rt *router.Router, registry fasthttp.RequestHandler) {
	for path, file := range map[string]string{"/": "index.html", "/console.js": "console.js", "/console.css": "console.css"} {
		body, err := consoleFiles.ReadFile("console/" + file)
		if err != nil { // the files are embedded at build time: a bug
			panic(err)
		}
		ctype := "text/html; charset=utf-8"
		switch {
		case strings.HasSuffix(file, ".js"):
			ctype = "text/javascript; charset=utf-8"
		case strings.HasSuffix(file, ".css"):
			ctype = "text/css; charset=utf-8"
		}
		rt.GET(path, func(ctx *fasthttp.RequestCtx) {
			h := &ctx.Response.Header
			h.Set("Content-Security-Policy", consoleCSP)
			h.Set("X-Content-Type-Options", "nosniff")
			h.Set("X-Frame-Options", "DENY")
			h.Set("Referrer-Policy", "no-referrer")
			h.Set("Cache-Control", "no-cache")
			ctx.SetContentType(ctype)
			ctx.SetBody(body)
		})
	}
	rt.ANY("/registry/{path:*}", registry)
}
