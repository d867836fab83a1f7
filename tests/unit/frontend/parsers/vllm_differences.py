# ruff: noqa: E501  (a data table: one difference a line reads better than one wrapped over four)
"""Every intended difference between our parsers and vLLM's non-streamed result on the differential
table (test_vllm_differential.py), with its reason: what we answer instead, per (family, row). The
test checks each as a difference: ours must be exactly this, and vLLM's must differ from it."""
from __future__ import annotations

from tests.unit.frontend.parsers.vllm_reference import Result

REASONS = {
    "text_after": "Text after the calls is content, not dropped: vLLM returns only the text before the first call.",
    "pythonic_text_after": "vLLM's pythonic returns the whole output as content when any text follows the list; the "
                           "calls were streamed when the list closed, so they stay calls and the text after is content.",
    "llama_text_before": "llama3_json reads calls anywhere and keeps the text before them as content (what a user "
                         "wants: the call run, the words shown). vLLM's non-streamed path drops the text; its "
                         "streamed path returns all of it as content, call included.",
    "trailing_whitespace": "Text before a call keeps its trailing whitespace: it was streamed before the call's tag "
                           "arrived. vLLM strips it in these families (hermes and the JSON families keep it too).",
    "qwen3_prompt": "qwen3 and seed_oss reasoning: the rendered prompt says whether the output starts in reasoning (here it does "
                    "not, prompt \"\"); vLLM assumes thinking is on, so untagged text is reasoning there.",
    "think_whitespace": "The whitespace after </think> (the template's separator) is dropped; vLLM keeps \"\\n\\n\".",
    "earlier_calls_kept": "Calls before a broken one stay calls (each was sent when it closed, before the broken one "
                          "began) and the broken one is content as written; vLLM returns the whole output as content.",
    "never_half_call": "A call the model did not finish (arguments no complete JSON object, or the output ended "
                       "inside it) is never sent (the rule). vLLM sends it: with the broken text as arguments "
                       "(mistral, kimi_k2), without the value cut ({} for qwen3_coder, qwen3_xml, seed_oss and glm45; glm45 also when only "
                       "its </tool_call> is missing), finish_reason tool_calls. mistral and the XML families return "
                       "its text as content, as the model wrote it; kimi_k2 and deepseek drop it (control tokens, as "
                       "vLLM's deepseek drops a cut call).",
    "length_finish": "finish_reason stays length when the output was cut, calls or not: vLLM says tool_calls.",
    "kv_missing_end_tag": "A qwen3_coder value ends at a </parameter> followed by a tag (<parameter=, </function>, "
                          "</tool_call>), so a value may hold those tags (code that mentions them, a case in "
                          "test_qwen3_coder.py); the cost, here: a value whose </parameter> the model left out takes "
                          "the next parameter's text. vLLM ends a value at the next <parameter= instead, which cuts such "
                          "code short.",
}

DIFFERENCES: dict[tuple[str, str], tuple[str, Result]] = {
    ('hermes', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('hermes', 'valid then malformed'): ('earlier_calls_kept', Result(content='<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3,}}\n</tool_call>', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='tool_calls')),
    ('hermes', 'call then cut by length'): ('earlier_calls_kept', Result(content='<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('llama3_json', 'text before'): ('llama_text_before', Result(content='Let me check.\n', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('llama3_json', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('llama3_json', 'valid then malformed'): ('earlier_calls_kept', Result(content='{"name": "get_weather", "parameters": {"city": "Paris", "days": 3,}}', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='tool_calls')),
    ('llama3_json', 'call then cut by length'): ('earlier_calls_kept', Result(content='{"name": "get_weather", "parameters": {"city": "Pa', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('llama4_json', 'text before'): ('llama_text_before', Result(content='Let me check.\n', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('llama4_json', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('llama4_json', 'valid then malformed'): ('earlier_calls_kept', Result(content='{"name": "get_weather", "parameters": {"city": "Paris", "days": 3,}}', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='tool_calls')),
    ('llama4_json', 'call then cut by length'): ('earlier_calls_kept', Result(content='{"name": "get_weather", "parameters": {"city": "Pa', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('pythonic', 'text after'): ('pythonic_text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('mistral', 'text before'): ('trailing_whitespace', Result(content='Let me check.\n', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('mistral', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('mistral', 'malformed'): ('never_half_call', Result(content='[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3,}', reasoning='', calls=(), finish='stop')),
    ('mistral', 'valid then malformed'): ('never_half_call', Result(content='[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3,}', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='tool_calls')),
    ('mistral', 'unclosed'): ('never_half_call', Result(content='[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3', reasoning='', calls=(), finish='stop')),
    ('mistral', 'cut, ended normally'): ('never_half_call', Result(content='[TOOL_CALLS]get_weather[ARGS]{"city": "Pa', reasoning='', calls=(), finish='stop')),
    ('mistral', 'cut by length'): ('never_half_call', Result(content='[TOOL_CALLS]get_weather[ARGS]{"city": "Pa', reasoning='', calls=(), finish='length')),
    ('mistral', 'call then cut by length'): ('never_half_call', Result(content='[TOOL_CALLS]get_weather[ARGS]{"city": "Pa', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('qwen3_coder', 'text before'): ('trailing_whitespace', Result(content='Let me check.\n', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('qwen3_coder', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('qwen3_coder', 'malformed'): ('kv_missing_end_tag', Result(content='', reasoning='', calls=(('get_weather', {'city': 'Paris\n\n<parameter=days>\n3'}),), finish='tool_calls')),
    ('qwen3_coder', 'valid then malformed'): ('kv_missing_end_tag', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}), ('get_weather', {'city': 'Paris\n\n<parameter=days>\n3'})), finish='tool_calls')),
    ('qwen3_coder', 'cut, ended normally'): ('never_half_call', Result(content='<tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(), finish='stop')),
    ('qwen3_coder', 'cut by length'): ('never_half_call', Result(content='<tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(), finish='length')),
    ('qwen3_coder', 'call then cut by length'): ('never_half_call', Result(content='<tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('qwen3_xml', 'text before'): ('trailing_whitespace', Result(content='Let me check.\n', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('qwen3_xml', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('qwen3_xml', 'malformed'): ('kv_missing_end_tag', Result(content='', reasoning='', calls=(('get_weather', {'city': 'Paris\n\n<parameter=days>\n3'}),), finish='tool_calls')),
    ('qwen3_xml', 'valid then malformed'): ('kv_missing_end_tag', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}), ('get_weather', {'city': 'Paris\n\n<parameter=days>\n3'})), finish='tool_calls')),
    ('qwen3_xml', 'cut, ended normally'): ('never_half_call', Result(content='<tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(), finish='stop')),
    ('qwen3_xml', 'cut by length'): ('never_half_call', Result(content='<tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(), finish='length')),
    ('qwen3_xml', 'call then cut by length'): ('never_half_call', Result(content='<tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('seed_oss', 'text before'): ('trailing_whitespace', Result(content='Let me check.\n', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('seed_oss', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('seed_oss', 'malformed'): ('kv_missing_end_tag', Result(content='', reasoning='', calls=(('get_weather', {'city': 'Paris\n\n<parameter=days>\n3'}),), finish='tool_calls')),
    ('seed_oss', 'valid then malformed'): ('kv_missing_end_tag', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}), ('get_weather', {'city': 'Paris\n\n<parameter=days>\n3'})), finish='tool_calls')),
    ('seed_oss', 'cut, ended normally'): ('never_half_call', Result(content='<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(), finish='stop')),
    ('seed_oss', 'cut by length'): ('never_half_call', Result(content='<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(), finish='length')),
    ('seed_oss', 'call then cut by length'): ('never_half_call', Result(content='<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('glm45', 'text before'): ('trailing_whitespace', Result(content='Let me check.\n', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('glm45', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('glm45', 'unclosed'): ('never_half_call', Result(content='<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n', reasoning='', calls=(), finish='stop')),
    ('glm45', 'cut, ended normally'): ('never_half_call', Result(content='<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa', reasoning='', calls=(), finish='stop')),
    ('glm45', 'cut by length'): ('never_half_call', Result(content='<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa', reasoning='', calls=(), finish='length')),
    ('glm45', 'call then cut by length'): ('never_half_call', Result(content='<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('kimi_k2', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('kimi_k2', 'malformed'): ('never_half_call', Result(content='', reasoning='', calls=(), finish='stop')),
    ('kimi_k2', 'valid then malformed'): ('never_half_call', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='tool_calls')),
    ('kimi_k2', 'cut, ended normally'): ('never_half_call', Result(content='', reasoning='', calls=(), finish='stop')),
    ('kimi_k2', 'cut by length'): ('never_half_call', Result(content='', reasoning='', calls=(), finish='length')),
    ('kimi_k2', 'call then cut by length'): ('never_half_call', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('deepseek_v3', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('deepseek_v3', 'malformed'): ('never_half_call', Result(content='', reasoning='', calls=(), finish='stop')),
    ('deepseek_v3', 'valid then malformed'): ('never_half_call', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='tool_calls')),
    ('deepseek_v3', 'call then cut by length'): ('length_finish', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('deepseek_v31', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('deepseek_v31', 'malformed'): ('never_half_call', Result(content='', reasoning='', calls=(), finish='stop')),
    ('deepseek_v31', 'valid then malformed'): ('never_half_call', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='tool_calls')),
    ('deepseek_v31', 'call then cut by length'): ('length_finish', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('qwen3+hermes', 'plain text'): ('qwen3_prompt', Result(content='The weather in Paris is mild.', reasoning='', calls=(), finish='stop')),
    ('qwen3+hermes', 'text before'): ('qwen3_prompt', Result(content='Let me check.\n', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('qwen3+hermes', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('qwen3+hermes', 'valid then malformed'): ('earlier_calls_kept', Result(content='<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3,}}\n</tool_call>', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='tool_calls')),
    ('qwen3+hermes', 'call then cut by length'): ('earlier_calls_kept', Result(content='<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('qwen3+hermes', 'reasoning, no call'): ('think_whitespace', Result(content='It is mild.', reasoning='I should check the weather.', calls=(), finish='stop')),
    ('qwen3+qwen3_coder', 'plain text'): ('qwen3_prompt', Result(content='The weather in Paris is mild.', reasoning='', calls=(), finish='stop')),
    ('qwen3+qwen3_coder', 'text before'): ('qwen3_prompt', Result(content='Let me check.\n', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('qwen3+qwen3_coder', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('qwen3+qwen3_coder', 'malformed'): ('kv_missing_end_tag', Result(content='', reasoning='', calls=(('get_weather', {'city': 'Paris\n\n<parameter=days>\n3'}),), finish='tool_calls')),
    ('qwen3+qwen3_coder', 'valid then malformed'): ('kv_missing_end_tag', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}), ('get_weather', {'city': 'Paris\n\n<parameter=days>\n3'})), finish='tool_calls')),
    ('qwen3+qwen3_coder', 'cut, ended normally'): ('never_half_call', Result(content='<tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(), finish='stop')),
    ('qwen3+qwen3_coder', 'cut by length'): ('never_half_call', Result(content='<tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(), finish='length')),
    ('qwen3+qwen3_coder', 'call then cut by length'): ('never_half_call', Result(content='<tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('qwen3+qwen3_coder', 'reasoning, no call'): ('think_whitespace', Result(content='It is mild.', reasoning='I should check the weather.', calls=(), finish='stop')),
    ('glm45+glm45', 'text before'): ('trailing_whitespace', Result(content='', reasoning='Let me check.\n', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('glm45+glm45', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('glm45+glm45', 'unclosed'): ('never_half_call', Result(content='<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n', reasoning='', calls=(), finish='stop')),
    ('glm45+glm45', 'cut, ended normally'): ('never_half_call', Result(content='<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa', reasoning='', calls=(), finish='stop')),
    ('glm45+glm45', 'cut by length'): ('never_half_call', Result(content='<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa', reasoning='', calls=(), finish='length')),
    ('glm45+glm45', 'call then cut by length'): ('never_half_call', Result(content='<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('glm45+glm45', 'reasoning, no call'): ('think_whitespace', Result(content='It is mild.', reasoning='I should check the weather.', calls=(), finish='stop')),
    ('kimi_k2+kimi_k2', 'text before'): ('trailing_whitespace', Result(content='', reasoning='Let me check.\n', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('kimi_k2+kimi_k2', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('kimi_k2+kimi_k2', 'malformed'): ('never_half_call', Result(content='', reasoning='', calls=(), finish='stop')),
    ('kimi_k2+kimi_k2', 'valid then malformed'): ('never_half_call', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='tool_calls')),
    ('kimi_k2+kimi_k2', 'cut, ended normally'): ('never_half_call', Result(content='', reasoning='', calls=(), finish='stop')),
    ('kimi_k2+kimi_k2', 'cut by length'): ('never_half_call', Result(content='', reasoning='', calls=(), finish='length')),
    ('kimi_k2+kimi_k2', 'call then cut by length'): ('never_half_call', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('kimi_k2+kimi_k2', 'reasoning, no call'): ('think_whitespace', Result(content='It is mild.', reasoning='I should check the weather.', calls=(), finish='stop')),
    ('deepseek_r1+deepseek_v3', 'reasoning, no call'): ('think_whitespace', Result(content='It is mild.', reasoning='I should check the weather.', calls=(), finish='stop')),
    ('seed_oss+seed_oss', 'plain text'): ('qwen3_prompt', Result(content='The weather in Paris is mild.', reasoning='', calls=(), finish='stop')),
    ('seed_oss+seed_oss', 'text before'): ('qwen3_prompt', Result(content='Let me check.\n', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('seed_oss+seed_oss', 'text after'): ('text_after', Result(content='I asked for the weather.', reasoning='', calls=(('get_weather', {'city': 'Paris', 'days': 3}),), finish='tool_calls')),
    ('seed_oss+seed_oss', 'malformed'): ('kv_missing_end_tag', Result(content='', reasoning='', calls=(('get_weather', {'city': 'Paris\n\n<parameter=days>\n3'}),), finish='tool_calls')),
    ('seed_oss+seed_oss', 'valid then malformed'): ('kv_missing_end_tag', Result(content='', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}), ('get_weather', {'city': 'Paris\n\n<parameter=days>\n3'})), finish='tool_calls')),
    ('seed_oss+seed_oss', 'cut, ended normally'): ('never_half_call', Result(content='<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(), finish='stop')),
    ('seed_oss+seed_oss', 'cut by length'): ('never_half_call', Result(content='<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(), finish='length')),
    ('seed_oss+seed_oss', 'call then cut by length'): ('never_half_call', Result(content='<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nPa', reasoning='', calls=(('search', {'query': 'rain', 'filters': {'unit': 'C'}}),), finish='length')),
    ('seed_oss+seed_oss', 'reasoning, no call'): ('think_whitespace', Result(content='It is mild.', reasoning='I should check the weather.', calls=(), finish='stop')),
}
