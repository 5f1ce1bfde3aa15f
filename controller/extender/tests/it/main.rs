//! The extender's integration tests, one binary: over a real TCP socket (`http`), the
//! answers with filter's kept results against fresh ones (`cache`), the
//! node cache and verbs against an in-memory cluster (`state`), the webhook over TLS
//! (`webhook`), the attacks on its protections (`auth`), and stopping while the API server
//! hangs (`stop`).

mod auth;
mod cache;
mod http;
mod state;
mod stop;
mod support;
mod webhook;
