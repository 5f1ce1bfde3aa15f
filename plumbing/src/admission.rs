//! `AdmissionReview` responses (`admission.k8s.io/v1`), the one shape both webhooks answer
//! with.

use base64::Engine as _;
use serde_json::{Value, json};

/// The `AdmissionReview` answering `review` (its `apiVersion` and `request.uid` echoed):
/// `allowed`, an optional status message (code 422 when denied), an optional JSON patch
/// (base64, `patchType: JSONPatch`) and warnings shown to the client.
pub fn response(
    review: &Value,
    allowed: bool,
    message: Option<&str>,
    patch: Option<&Value>,
    warnings: &[String],
) -> Value {
    let mut r = json!({
        "uid": review["request"]["uid"],
        "allowed": allowed,
    });
    if let Some(m) = message {
        r["status"] = json!({"code": if allowed { 200 } else { 422 }, "message": m});
    }
    if let Some(p) = patch {
        r["patchType"] = json!("JSONPatch");
        r["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(p.to_string()));
    }
    if !warnings.is_empty() {
        r["warnings"] = json!(warnings);
    }
    json!({
        "apiVersion": review["apiVersion"].as_str().unwrap_or("admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": r,
    })
}

/// A JSON pointer token (RFC 6901) for a JSON patch path: `~` → `~0`, `/` → `~1` (a
/// resource name such as `nvidia.com/gpu` is one token).
pub fn pointer_token(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_the_review_and_encodes_the_patch() {
        let review = json!({"apiVersion": "admission.k8s.io/v1", "request": {"uid": "u-1"}});
        let patch = json!([{"op": "add", "path": "/x", "value": 1}]);
        let r = response(&review, true, None, Some(&patch), &["w".into()]);
        assert_eq!(r["response"]["uid"], "u-1");
        assert_eq!(r["response"]["patchType"], "JSONPatch");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(r["response"]["patch"].as_str().unwrap())
            .unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&raw).unwrap(), patch);
        assert_eq!(r["response"]["warnings"], json!(["w"]));
        let denied = response(&review, false, Some("no"), None, &[]);
        assert_eq!(denied["response"]["status"]["code"], 422);
        assert!(denied["response"].get("warnings").is_none());
    }

    #[test]
    fn pointer_tokens_escape_tilde_then_slash() {
        assert_eq!(pointer_token("nvidia.com/gpu"), "nvidia.com~1gpu");
        assert_eq!(pointer_token("a~/b"), "a~0~1b");
    }
}
