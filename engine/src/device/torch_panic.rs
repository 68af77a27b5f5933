//! A panic's text as a worker reports it: libtorch's errors reach Rust as panics whose text
//! carries the C++ stack trace, which says nothing to an operator.

/// A panic payload as text, without libtorch's C++ stack trace.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    let text = if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        String::new()
    };
    // Torch errors carry "Exception raised from ..." and frames, as real newlines or (inside a
    // Debug-formatted error) as `\n` escapes.
    let mut text = text
        .split("Exception raised from")
        .next()
        .unwrap_or_default()
        .trim();
    while let Some(rest) = text.strip_suffix("\\n") {
        text = rest.trim_end();
    }
    if text.is_empty() {
        "panicked".into()
    } else {
        format!("panicked: {text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_texts_drop_the_cpp_backtrace() {
        let text = |s: &str| {
            let payload: Box<dyn std::any::Any + Send> = Box::new(s.to_string());
            panic_text(payload.as_ref())
        };
        assert_eq!(
            text("bad shape\nException raised from x\nframe #0: y"),
            "panicked: bad shape"
        );
        assert_eq!(
            text(r#"unwrap: Torch("size mismatch\nException raised from f\nframe #0")"#),
            r#"panicked: unwrap: Torch("size mismatch"#
        );
        assert_eq!(text("no match in"), "panicked: no match in");
        let opaque: Box<dyn std::any::Any + Send> = Box::new(7u8);
        assert_eq!(panic_text(opaque.as_ref()), "panicked");
    }
}
