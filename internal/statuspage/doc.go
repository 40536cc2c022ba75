// Package statuspage renders the daemon's status page, served on GET / of its HTTP address beside /metrics:
// one server-rendered HTML page (html/template, no JavaScript, no front-end build) that reloads itself every few
// seconds.
//
// Per keyspace it shows the tracked and hot counts, the refreshes by result, the errors, and the SLO counter (hot
// keys that expired before their refresh, red when above 0); an SVG histogram of when the hot keys expire, which
// shows whether jitter spreads them out or they bunch up; and the hot keys themselves, nearest expiry first, with
// their TTL left, next refresh, score and last rebuild time. A table lists the cron schedules with their next and
// last runs, when the daemon provides them.
//
// Every key and value goes through html/template's contextual escaping (keys may hold any text, "<script>"
// included), keys with control characters are shown Go-quoted, and the Content-Security-Policy forbids scripts
// altogether. The page is read-only; like /debug/*, it is on the daemon's listen address, loopback by default.
package statuspage
