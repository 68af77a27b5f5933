use super::*;

fn chatml() -> ChatTemplate {
    let source = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                  {% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}";
    ChatTemplate::compile(source.into(), "t.jinja".into()).unwrap()
}

fn rendered_prompt(row: &RegenRow, turn: usize, thinking: bool) -> String {
    let options = ChatOptions {
        enable_thinking: Some(thinking),
        ..ChatOptions::default()
    };
    render_prompt(&chatml(), &options, &row.prompt(turn).unwrap()).unwrap()
}

fn reply(content: &str) -> Reply {
    Reply {
        reasoning: None,
        content: content.into(),
    }
}

#[test]
fn every_assistant_turn_is_regenerated_in_order_and_later_prompts_see_earlier_replies() {
    let line = r#"{"id":"a","conversations":[{"role":"system","content":"S"},
        {"role":"user","content":"q1"},{"role":"assistant","content":"old1","reasoning_content":"r"},
        {"role":"user","content":"q2"},{"role":"assistant","content":"old2"}]}"#;
    let mut row = RegenRow::parse(line).unwrap();
    assert_eq!(row.turns(), 2);
    assert_eq!(
        rendered_prompt(&row, 0, false),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n"
    );
    row.set_reply(0, reply("new1"));
    let second = rendered_prompt(&row, 1, false);
    assert!(
        second.contains("assistant\nnew1<|im_end|>\n<|im_start|>user\nq2"),
        "{second}"
    );
    assert!(!second.contains("old"), "{second}");
    row.set_reply(1, reply("new2"));
    let out: Value = serde_json::from_str(&row.into_line(7)).unwrap();
    assert_eq!(out["id"], "a");
    assert_eq!(out[SOURCE_LINE_KEY], 7);
    let m = out["conversations"].as_array().unwrap();
    let contents: Vec<&str> = m.iter().map(|m| m["content"].as_str().unwrap()).collect();
    assert_eq!(contents, ["S", "q1", "new1", "q2", "new2"]);
    // the old reasoning belonged to the old reply
    assert!(m[2].get("reasoning_content").is_none());
}

#[test]
fn sharegpt_rows_keep_their_spelling_and_trailing_turns_stay_verbatim() {
    let line = r#"{"conversations":[{"from":"human","value":"hi"},{"from":"gpt","value":"old"},
        {"from":"human","value":"more?"}]}"#;
    let mut row = RegenRow::parse(line).unwrap();
    assert_eq!(row.turns(), 1);
    row.set_reply(
        0,
        Reply {
            reasoning: Some("think".into()),
            content: "new".into(),
        },
    );
    let out: Value = serde_json::from_str(&row.into_line(1)).unwrap();
    let m = out["conversations"].as_array().unwrap();
    assert_eq!(m.len(), 3);
    assert_eq!(m[1]["from"], "gpt");
    assert_eq!(m[1]["value"], "new");
    assert_eq!(m[1]["reasoning_content"], "think");
    assert!(m[1].get("content").is_none());
    assert_eq!(m[2]["value"], "more?");
    // and the output is a row training reads
    parse_chat_line(&serde_json::to_string(&out).unwrap(), None).unwrap();
}

#[test]
fn a_tool_calling_turn_is_the_last_one_regenerated_and_the_row_is_cut_after_it() {
    let line = r#"{"tools":[{"type":"function","function":{"name":"f"}}],"conversations":[
        {"role":"user","content":"weather?"},
        {"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]},
        {"role":"tool","content":"sunny"},{"role":"assistant","content":"It is sunny."}]}"#;
    let mut row = RegenRow::parse(line).unwrap();
    assert_eq!(row.turns(), 1);
    assert!(row.prompt(0).unwrap().tools.is_some());
    row.set_reply(0, reply("<tool_call>{}</tool_call>"));
    let out: Value = serde_json::from_str(&row.into_line(3)).unwrap();
    let m = out["conversations"].as_array().unwrap();
    assert_eq!(m.len(), 2, "{out}");
    assert!(m[1].get("tool_calls").is_none());
    assert_eq!(m[1]["content"], "<tool_call>{}</tool_call>");
    assert!(out.get("tools").is_some());
    // an empty tool_calls list (or its JSON text) is no call
    for calls in [r#"[]"#, r#""[]""#, "null"] {
        let line = format!(
            r#"{{"conversations":[{{"role":"user","content":"q"}},{{"role":"assistant","content":"a","tool_calls":{calls}}},
            {{"role":"user","content":"q"}},{{"role":"assistant","content":"b"}}]}}"#
        );
        assert_eq!(RegenRow::parse(&line).unwrap().turns(), 2, "{calls}");
    }
}

#[test]
fn rows_training_would_refuse_are_refused_with_its_reasons() {
    for (line, expected) in [
        ("{", "not a chat row"),
        (
            r#"{"conversations":[{"role":"user","content":"q"}]}"#,
            "no assistant message",
        ),
        (
            r#"{"conversations":[{"role":"bot","content":"q"}]}"#,
            "role \"bot\"",
        ),
        // serde reads a struct from a list too; a row is made of message objects
        (
            r#"{"conversations":[{"role":"user","content":"q"},["assistant",null,"a",null,null,null]]}"#,
            "message 1 is not a JSON object",
        ),
    ] {
        let err = RegenRow::parse(line).unwrap_err();
        assert!(err.contains(expected), "{line}: {err}");
    }
}

#[test]
fn the_messages_spelling_is_kept() {
    let line = r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}"#;
    let mut row = RegenRow::parse(line).unwrap();
    row.set_reply(0, reply("b"));
    let out: Value = serde_json::from_str(&row.into_line(2)).unwrap();
    assert_eq!(out["messages"][1]["content"], "b");
    assert!(out.get("conversations").is_none());
}

#[test]
fn the_prompt_carries_the_generation_prompt_and_thinking_setting() {
    let line =
        r#"{"conversations":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}"#;
    let row = RegenRow::parse(line).unwrap();
    assert!(rendered_prompt(&row, 0, true).ends_with("<|im_start|>assistant\n<think>\n"));
    assert!(rendered_prompt(&row, 0, false).ends_with("<|im_start|>assistant\n"));
}

#[test]
fn reasoning_is_split_off_like_the_qwen3_parser() {
    let thinking = "<|im_start|>assistant\n<think>\n";
    let plain = "<|im_start|>assistant\n";
    let split = |prompt, text| {
        let r = split_reasoning(prompt, text);
        (r.reasoning, r.content)
    };
    assert_eq!(
        split(thinking, "I think.\n</think>\n\nAnswer."),
        (Some("I think.".into()), "Answer.".into())
    );
    // out of tokens while thinking: all of it is reasoning
    assert_eq!(
        split(thinking, "Still thinking"),
        (Some("Still thinking".into()), String::new())
    );
    assert_eq!(split(plain, "Just text."), (None, "Just text.".into()));
    // a target that opens its own think block
    assert_eq!(
        split(plain, "<think>\nhm\n</think>\n\nok"),
        (Some("hm".into()), "ok".into())
    );
}

#[test]
fn turn_seeds_depend_on_seed_line_and_turn_only() {
    assert_eq!(turn_seed(5, 10, 0), turn_seed(5, 10, 0));
    let seeds = [
        turn_seed(5, 10, 0),
        turn_seed(5, 10, 1),
        turn_seed(5, 11, 0),
        turn_seed(7, 10, 0),
    ];
    for (i, a) in seeds.iter().enumerate() {
        for b in &seeds[i + 1..] {
            assert_ne!(a, b);
        }
    }
    // "seed + line index": shifting both keeps the conversation's seed
    assert_eq!(turn_seed(5, 10, 0), turn_seed(4, 11, 0));
}
