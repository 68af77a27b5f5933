//! SpecForge-style chat rows: `{"id": ..., "conversations": [{"role", "content",
//! "reasoning_content"?, "tool_calls"?}], "tools"?: [...]}`, checked and normalized into the
//! message list a chat template receives.
use minijinja::value::{Value, ValueKind};
use serde::Deserialize;

#[derive(Deserialize)]
struct Row {
    #[serde(alias = "messages")]
    conversations: Vec<RawMessage>,
    #[serde(default)]
    tools: Option<Value>,
}

#[derive(Deserialize)]
struct RawMessage {
    role: Option<String>,
    /// ShareGPT spelling of `role` (`human`/`gpt`), accepted as SF does.
    from: Option<String>,
    content: Option<String>,
    /// ShareGPT spelling of `content`.
    value: Option<String>,
    reasoning_content: Option<String>,
    tool_calls: Option<Value>,
}

/// A row ready for the template: messages (and tools) as template values, key order kept.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub messages: Value,
    pub tools: Option<Value>,
}

/// Parses one line. `system_prompt` is put first when the row has no system message (SF's
/// template default). `Err` is the reason the line is bad.
pub fn parse_line(line: &str, system_prompt: Option<&str>) -> Result<Conversation, String> {
    let (messages, tools) = parse_messages(line, system_prompt)?;
    if !messages.iter().any(|(role, _)| *role == "assistant") {
        return Err("no assistant message, so nothing to train on".to_string());
    }
    Ok(conversation(messages, tools))
}

/// Parses one line as a generation prompt: the conversation without its closing assistant
/// answer (the turns from the last assistant turn on, when the row ends with one; the whole row
/// when it ends with a user or tool turn), for rendering with the generation prompt. `Err` is
/// the reason the line is bad.
pub fn parse_prompt_line(line: &str, system_prompt: Option<&str>) -> Result<Conversation, String> {
    let (mut messages, tools) = parse_messages(line, system_prompt)?;
    while messages
        .last()
        .is_some_and(|(role, _)| *role == "assistant")
    {
        messages.pop();
    }
    if !messages.iter().any(|(role, _)| *role != "system") {
        return Err(
            "nothing before the last assistant turn but a system message; a prompt needs a \
             user turn to answer"
                .to_string(),
        );
    }
    Ok(conversation(messages, tools))
}

type Messages = Vec<(&'static str, Value)>;

fn parse_messages(
    line: &str,
    system_prompt: Option<&str>,
) -> Result<(Messages, Option<Value>), String> {
    let row: Row = serde_json::from_str(line).map_err(|e| {
        format!("not a chat row ({e}); expected {{\"conversations\": [{{\"role\": ..., \"content\": ...}}]}}")
    })?;
    if row.conversations.is_empty() {
        return Err("`conversations` is empty".to_string());
    }
    let mut messages = Vec::with_capacity(row.conversations.len() + 1);
    for (index, raw) in row.conversations.into_iter().enumerate() {
        messages.push(normalize(raw).map_err(|e| format!("message {index}: {e}"))?);
    }
    if let Some(prompt) = system_prompt.filter(|p| !p.is_empty()) {
        if messages[0].0 != "system" {
            let system = Value::from_iter([
                ("role", Value::from("system")),
                ("content", Value::from(prompt)),
            ]);
            messages.insert(0, ("system", system));
        }
    }
    let tools = row.tools.map(parse_tools).transpose()?;
    Ok((messages, tools))
}

fn conversation(messages: Messages, tools: Option<Value>) -> Conversation {
    Conversation {
        messages: Value::from_iter(messages.into_iter().map(|(_, m)| m)),
        tools,
    }
}

fn normalize(raw: RawMessage) -> Result<(&'static str, Value), String> {
    let role = raw.role.or(raw.from).ok_or("has no `role`")?;
    let role = match role.as_str() {
        "system" => "system",
        "user" | "human" => "user",
        "assistant" | "gpt" => "assistant",
        "tool" => "tool",
        other => {
            return Err(format!(
                "role {other:?} is not one of system, user, assistant, tool"
            ))
        }
    };
    // Like SF: a missing or null content renders as an empty string.
    let content = raw.content.or(raw.value).unwrap_or_default();
    let mut fields = vec![
        ("role", Value::from(role)),
        ("content", Value::from(content)),
    ];
    if let Some(reasoning) = raw.reasoning_content {
        fields.push(("reasoning_content", Value::from(reasoning)));
    }
    if let Some(calls) = raw.tool_calls.filter(|c| !c.is_none()) {
        fields.push(("tool_calls", parse_tool_calls(calls)?));
    }
    Ok((role, Value::from_iter(fields)))
}

/// Tool calls as the templates expect them: a list whose `function.arguments` is a mapping
/// (templates iterate `arguments|items`). Data often stores either as a JSON string.
fn parse_tool_calls(calls: Value) -> Result<Value, String> {
    let calls = decode_if_string(calls, "tool_calls")?;
    if calls.kind() != ValueKind::Seq {
        return Err(format!(
            "`tool_calls` is a {}; expected a list",
            calls.kind()
        ));
    }
    let mut out = Vec::new();
    for (i, call) in iterate(&calls)?.into_iter().enumerate() {
        if call.kind() != ValueKind::Map {
            return Err(format!(
                "tool_calls[{i}] is a {}; expected a mapping",
                call.kind()
            ));
        }
        let mut fields = Vec::new();
        for key in iterate(&call)? {
            let value = call.get_item(&key).map_err(|e| e.to_string())?;
            let value = if key.as_str() == Some("function") {
                parse_function(value).map_err(|e| format!("tool_calls[{i}].function: {e}"))?
            } else {
                value
            };
            fields.push((key, value));
        }
        out.push(Value::from_iter(fields));
    }
    Ok(Value::from(out))
}

fn parse_function(function: Value) -> Result<Value, String> {
    if function.kind() != ValueKind::Map {
        return Err(format!("is a {}; expected a mapping", function.kind()));
    }
    let mut fields = Vec::new();
    for key in iterate(&function)? {
        let value = function.get_item(&key).map_err(|e| e.to_string())?;
        let value = if key.as_str() == Some("arguments") {
            decode_if_string(value, "arguments")?
        } else {
            value
        };
        fields.push((key, value));
    }
    Ok(Value::from_iter(fields))
}

fn parse_tools(tools: Value) -> Result<Value, String> {
    let tools = decode_if_string(tools, "tools")?;
    match tools.kind() {
        ValueKind::Seq | ValueKind::None => Ok(tools),
        kind => Err(format!("`tools` is a {kind}; expected a list")),
    }
}

fn decode_if_string(value: Value, what: &str) -> Result<Value, String> {
    match value.as_str() {
        Some(text) => serde_json::from_str(text)
            .map_err(|e| format!("`{what}` is a string that is not valid JSON ({e})")),
        None => Ok(value),
    }
}

fn iterate(value: &Value) -> Result<Vec<Value>, String> {
    Ok(value.try_iter().map_err(|e| e.to_string())?.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(line: &str) -> Vec<Value> {
        iterate(&parse_line(line, None).unwrap().messages).unwrap()
    }

    fn prompt_roles(line: &str) -> Vec<String> {
        iterate(&parse_prompt_line(line, None).unwrap().messages)
            .unwrap()
            .iter()
            .map(|m| m.get_attr("role").unwrap().as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn a_prompt_is_the_row_without_its_closing_answer() {
        let multi = r#"{"conversations":[{"role":"user","content":"q1"},
            {"role":"assistant","content":"a1"},{"role":"user","content":"q2"},
            {"role":"assistant","content":"a2"}]}"#;
        assert_eq!(prompt_roles(multi), ["user", "assistant", "user"]);
        // a row that ends with a question is the prompt as it stands
        let asked = r#"{"conversations":[{"role":"user","content":"q1"},
            {"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}"#;
        assert_eq!(prompt_roles(asked), ["user", "assistant", "user"]);
        // no assistant turn: the whole conversation is the prompt
        let open =
            r#"{"conversations":[{"role":"system","content":"s"},{"role":"user","content":"q"}]}"#;
        assert_eq!(prompt_roles(open), ["system", "user"]);
        // a training row still needs an answer to learn from
        assert!(parse_line(open, None).unwrap_err().contains("no assistant"));
    }

    #[test]
    fn a_prompt_with_no_user_turn_before_the_answer_is_refused() {
        let line = r#"{"conversations":[{"role":"system","content":"s"},{"role":"assistant","content":"a"}]}"#;
        let err = parse_prompt_line(line, None).unwrap_err();
        assert!(err.contains("needs a user turn"), "{err}");
        assert!(parse_prompt_line(r#"{"conversations":[]}"#, None)
            .unwrap_err()
            .contains("empty"));
    }

    #[test]
    fn keeps_roles_content_and_reasoning() {
        let m = messages(
            r#"{"id":"1","conversations":[{"role":"user","content":"q"},
               {"role":"assistant","content":"a","reasoning_content":"r","extra":1}]}"#,
        );
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[1].get_attr("reasoning_content").unwrap().as_str(),
            Some("r")
        );
        assert!(m[1].get_attr("extra").unwrap().is_undefined());
        assert!(m[0].get_attr("reasoning_content").unwrap().is_undefined());
    }

    #[test]
    fn normalizes_sharegpt_spelling_and_null_content() {
        let m = messages(
            r#"{"conversations":[{"from":"human","value":"q"},{"from":"gpt","content":null}]}"#,
        );
        assert_eq!(m[0].get_attr("role").unwrap().as_str(), Some("user"));
        assert_eq!(m[0].get_attr("content").unwrap().as_str(), Some("q"));
        assert_eq!(m[1].get_attr("role").unwrap().as_str(), Some("assistant"));
        assert_eq!(m[1].get_attr("content").unwrap().as_str(), Some(""));
    }

    #[test]
    fn decodes_string_tool_calls_and_arguments_keeping_key_order() {
        let m = messages(
            r#"{"conversations":[{"role":"user","content":"q"},{"role":"assistant","content":"",
               "tool_calls":"[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"z\\\":1,\\\"a\\\":2}\"}}]"}]}"#,
        );
        let args = m[1]
            .get_attr("tool_calls")
            .unwrap()
            .get_item_by_index(0)
            .unwrap()
            .get_attr("function")
            .unwrap()
            .get_attr("arguments")
            .unwrap();
        let keys: Vec<String> = iterate(&args)
            .unwrap()
            .iter()
            .map(|k| k.to_string())
            .collect();
        assert_eq!(keys, vec!["z", "a"]);
    }

    #[test]
    fn adds_the_default_system_prompt_only_when_missing() {
        let line = r#"{"conversations":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}"#;
        let m = iterate(&parse_line(line, Some("Be brief.")).unwrap().messages).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(
            m[0].get_attr("content").unwrap().as_str(),
            Some("Be brief.")
        );
        let line = r#"{"conversations":[{"role":"system","content":"S"},{"role":"assistant","content":"a"}]}"#;
        assert_eq!(
            iterate(&parse_line(line, Some("Be brief.")).unwrap().messages)
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn rejects_malformed_rows_with_reasons() {
        let cases = [
            ("{", "not a chat row"),
            (r#"{"id":"x"}"#, "missing field `conversations`"),
            (r#"{"conversations":[]}"#, "is empty"),
            (
                r#"{"conversations":[{"role":"user","content":"q"}]}"#,
                "no assistant message",
            ),
            (
                r#"{"conversations":[{"role":"bot","content":"q"}]}"#,
                "message 0: role \"bot\"",
            ),
            (
                r#"{"conversations":[{"content":"q"}]}"#,
                "message 0: has no `role`",
            ),
            (
                r#"{"conversations":[{"role":"user","content":["q"]}]}"#,
                "not a chat row",
            ),
            (
                r#"{"conversations":[{"role":"assistant","content":"","tool_calls":"[oops"}]}"#,
                "`tool_calls` is a string that is not valid JSON",
            ),
            (
                r#"{"conversations":[{"role":"assistant","content":"","tool_calls":[{"function":{"arguments":"{bad"}}]}]}"#,
                "tool_calls[0].function: `arguments` is a string",
            ),
            (
                r#"{"conversations":[{"role":"assistant","content":"a"}],"tools":{"a":1}}"#,
                "`tools` is a map",
            ),
        ];
        for (line, expected) in cases {
            let err = parse_line(line, None).unwrap_err();
            assert!(err.contains(expected), "{line}\n  -> {err}");
        }
    }
}
