/* Jinja engine: each construct, filter, test and whitespace rule, checked
 * against renderings made by Jinja2 3.1 in transformers' environment; and
 * malformed templates, which must fail with a message naming the line. */
#include "base/base.h"
#include "template/jinja.h"
#include "test.h"

/* Renders src with vars; returns a heap string or NULL (status in *st). */
static char *render(const char *src, const char *vars, loom_status *st) {
    loom_jinja_template *t = NULL;
    *st = loom_jinja_compile(src, strlen(src), &t);
    if (*st != LOOM_OK) return NULL;
    char *out = NULL;
    *st = loom_jinja_render(t, vars, &out, NULL);
    loom_jinja_free(t);
    return out;
}

#define CHECK_RENDER(src, vars, want)                                        \
    do {                                                                     \
        loom_status st_;                                                     \
        char *got_ = render((src), (vars), &st_);                            \
        CHECKF(got_ && !strcmp(got_, (want)), "template %s\n  want: %s\n  got:  %s", \
               (src), (want), got_ ? got_ : loom_last_error());              \
        free(got_);                                                          \
    } while (0)

/* Expects failure with status want_st and a message containing `part`. */
#define CHECK_FAIL(src, vars, want_st, part)                                 \
    do {                                                                     \
        loom_status st_;                                                     \
        char *got_ = render((src), (vars), &st_);                            \
        CHECKF(!got_ && st_ == (want_st) && strstr(loom_last_error(), (part)), \
               "template %s: want %s containing \"%s\", got %s \"%s\"", (src), \
               loom_status_str(want_st), (part), loom_status_str(st_),       \
               got_ ? got_ : loom_last_error());                             \
        free(got_);                                                          \
    } while (0)

static const char *VARS_JSON = "{\"messages\": [{\"role\": \"system\", \"content\": \"Sys\"}, {\"role\": \"user\", \"content\": \"Hi 'there'\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [1.5, \"x\"]}}}]}, {\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"part\"}, {\"type\": \"image\"}]}], \"x\": 3, \"s\": \"  Hello World  \", \"l\": [3, 1, 2], \"d\": {\"b\": 1, \"a\": 2}, \"f\": 2.5, \"n\": null, \"t\": true, \"u\": \"\345\244\232\350\260\242\357\274\201\", \"e\": \"\", \"words\": [\"b\", \"A\", \"c\", \"a\"], \"msgs\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}";

/* {template, expected}: expectations rendered by Jinja2 3.1 in transformers'
 * environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks). */
static const char *const CASES[][2] = {
    {"{{ x }} {{ f }} {{ n }} {{ t }} {{ l }} {{ d }} {{ e }}|{{ undefined_var }}|",
     "3 2.5 None True [3, 1, 2] {'b': 1, 'a': 2} ||"},
    {"{{ 1/2 }} {{ 4/2 }} {{ 7//2 }} {{ -7//2 }} {{ 7%3 }} {{ -7%3 }} {{ 2**10 }} {{ 2.0**3 }} {{ 1e3 }} {{ 0.1+0.2 }} {{ big }} {{ small }} {{ 1.5e-5 }} {{ 123456789012345678.0 }}",
     "0.5 2.0 3 -4 1 2 1024 8.0 1000.0 0.30000000000000004   1.5e-05 1.2345678901234568e+17"},
    {"{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1,2] + [3] }} {{ 'x' + 'y' }}",
     "a1NoneTrue ababab [1, 2, 3] xy"},
    {"{% if x > 2 and not n %}yes{% elif x %}mid{% else %}no{% endif %}",
     "yes"},
    {"{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.length }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }};{% endfor %}",
     "1/0/5/5/4/True/False;2/1/5/4/3/False/False;3/2/5/3/2/False/False;4/3/5/2/1/False/False;5/4/5/1/0/False/True;"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for a, b in [[1,2],[3,4]] %}{{ a+b }}{% endfor %}",
     "b=1,a=2,|ba|37"},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role }}{{ loop.length }} {% endfor %}",
     "1user4 2assistant4 3tool4 4user4 "},
    {"{% for m in [] %}x{% else %}empty{% endfor %}",
     "empty"},
    {"{% set ns = namespace(a=1, b='x') %}{% for i in range(5) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}",
     "11x"},
    {"{% set y = 1 %}{% for i in range(3) %}{% set y = y + i %}{{ y }}{% endfor %}{{ y }}",
     "1231"},
    {"{% set z %}inner {{ x }}{% endset %}[{{ z }}]",
     "[inner 3]"},
    {"{% macro m(a, b=2, c='z') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ m(1, c='q') }}",
     "1-2-z 1-3-z 1-2-q"},
    {"{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}body {{ x }}{% endcall %}",
     "<body 3>"},
    {"{% filter upper %}abc {{ s }}{% endfilter %}",
     "ABC   HELLO WORLD  "},
    {"{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
     "0134"},
    {"{{ s|trim }}|{{ s|length }}|{{ u|length }}|{{ l|join(',') }}|{{ s|upper }}|{{ s|lower }}|{{ 'hello world-foo(bar'|title }}|{{ 'hELLO'|capitalize }}|{{ s|replace('l','L') }}",
     "Hello World|15|3|3,1,2|  HELLO WORLD  |  hello world  |Hello World-Foo(Bar|Hello|  HeLLo WorLd  "},
    {"{{ n|default('dflt') }}|{{ undefined_v|default('dflt') }}|{{ e|default('dflt', true) }}|{{ e|d('z', boolean=true) }}",
     "None|dflt|dflt|z"},
    {"{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ messages|rejectattr('role', 'eq', 'user')|map(attribute='role')|join(',') }}|{{ [1,2,3,4]|select('odd')|list }}|{{ [1,2,3,4]|reject('even')|list }}|{{ messages|selectattr('tool_calls', 'defined')|list|length }}",
     "2|system,assistant,tool|[1, 3]|[1, 3]|1"},
    {"{{ [3,1,2,1]|unique|list }}|{{ words|sort }}|{{ words|sort(case_sensitive=true) }}|{{ l|sort(reverse=true) }}|{{ l|reverse|list }}|{{ 'abc'|reverse }}|{{ words|unique|list }}",
     "[3, 1, 2]|['A', 'a', 'b', 'c']|['A', 'a', 'b', 'c']|[3, 2, 1]|[2, 1, 3]|cba|['b', 'A', 'c']"},
    {"{{ messages[0]|tojson }}|{{ d|tojson(indent=2) }}|{{ u|tojson }}|{{ [1.0, 2, none, true, 'a\"b\\\\c\\n'] |tojson }}|{{ {}|tojson }}|{{ []|tojson(indent=2) }}",
     "{\"role\": \"system\", \"content\": \"Sys\"}|{\n  \"b\": 1,\n  \"a\": 2\n}|\"\345\244\232\350\260\242\357\274\201\"|[1.0, 2, null, true, \"a\\\"b\\\\c\\n\"]|{}|[]"},
    {"{{ 'a\\nb\\nc'|indent(2) }}|{{ 'a\\n\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(4, blank=true) }}|{{ 'one two  three'|wordcount }}|{{ d|dictsort }}|{{ l|min }}|{{ l|max }}|{{ l|sum }}|{{ [1,2,3,4,5]|batch(2)|list }}",
     "a\n  b\n  c|  a\n\n  b|a\n    \n    b|3|[('a', 2), ('b', 1)]|1|3|6|[[1, 2], [3, 4], [5]]"},
    {"{{ x is defined }}{{ y is defined }}{{ n is none }}{{ s is string }}{{ x is number }}{{ x is integer }}{{ f is float }}{{ d is mapping }}{{ l is iterable }}{{ s is sequence }}{{ t is boolean }}{{ t is true }}{{ t is false }}{{ x is odd }}{{ x is even }}{{ 9 is divisibleby 3 }}{{ x is eq 3 }}{{ x is ne 3 }}{{ x is lt 4 }}{{ x is gt 4 }}{{ 'a' is in 'abc' }}{{ x is not none }}{{ undefined_q is undefined }}",
     "TrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueFalseTrueTrueFalseTrueFalseTrueTrueTrue"},
    {"{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}|{{ s.startswith('  H') }}|{{ s.endswith(('x','  ')) }}|{{ 'abc'.upper() }}|{{ 'hello world'.title() }}|{{ 'aXa'.replace('a','b') }}|{{ '{} and {}'.format(1, 'two') }}|{{ 'xxhixx'.strip('x') }}",
     "Hello World|Hello World  |  Hello World|['Hello', 'World']|['a', 'b', '', 'c']|['a', 'b c']|True|True|ABC|Hello World|bXb|1 and two|hi"},
    {"{{ d.get('a') }}|{{ d.get('zz') }}|{{ d.get('zz', 5) }}|{{ d.keys()|list }}|{{ d.values()|list }}|{{ d['a'] }}|{{ d.a }}|{{ d.zz }}|{{ l[0] }}|{{ l[-1] }}|{{ l[5] }}|{{ messages[1]['content'] }}",
     "2|None|5|['b', 'a']|[1, 2]|2|2||3|2||Hi 'there'"},
    {"{{ l[::-1] }}|{{ l[1:] }}|{{ l[:1] }}|{{ 'hello'[1:3] }}|{{ u[:2] }}|{{ u[::-1] }}|{{ l[-2:] }}|{{ messages[1:]|length }}",
     "[2, 1, 3]|[1, 2]|[3]|el|\345\244\232\350\260\242|\357\274\201\350\260\242\345\244\232|[1, 2]|4"},
    {"{{ 'yes' if x else 'no' }}|{{ 'yes' if n else 'no' }}|{{ 'a' if false }}|{{ (1, 2) }}|{{ (1,) }}|{{ () }}|{{ {'a': [1, (2, 3)]} }}",
     "yes|no||(1, 2)|(1,)|()|{'a': [1, (2, 3)]}"},
    {"{{ 1 in l }}{{ 5 not in l }}{{ 'a' in d }}{{ 'ell' in 'hello' }}{{ 1 == 1.0 }}{{ 'a' != 'b' }}{{ [1,2] == [1,2] }}{{ true == 1 }}{{ none == none }}",
     "TrueTrueTrueTrueTrueTrueTrueTrueTrue"},
    {"{%- for m in messages -%}\n  {{- m.role -}}\n{%- endfor -%}\n",
     "systemuserassistanttooluser"},
    {"A\n  {% if true %}\n    B\n  {% endif %}\nC\n",
     "A\n    B\nC"},
    {"A\n  {%+ if true %}\n    B\n  {%- endif +%}\nC {# comment #}\nD\n  {# c2 #}\nE\n",
     "A\n      B\nC D\nE"},
    {"x {% if true %}  y  {% endif %} z\n\n",
     "x   y   z\n"},
    {"{{ 'a' }}\n{{ 'b' }}\n{% set q = 1 %}\n{{ q }}\n",
     "a\nb\n1"},
    {"{% raw %}{{ not a var }}{% endraw %}",
     "{{ not a var }}"},
    {"{{ messages[0].content.foo }}",
     ""},
    {"{{ [1,2,3]|map('string')|join('-') }}|{{ ['a','b']|map('upper')|list }}|{{ range(1, 10, 3)|list }}|{{ range(3)|list }}",
     "1-2-3|['A', 'B']|[1, 4, 7]|[0, 1, 2]"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set t = (1, 'x') %}{{ t[1] }}|{{ dict(a=1, b=2) }}|{{ namespace(a=1).a }}",
     "12|x|{'a': 1, 'b': 2}|1"},
    {"{{ 'It''s' }}{{ \"con\" 'cat' }}|{{ '\\u00e9\\x41\\t|' }}|{{ 'a\\'b' }}",
     "Itsconcat|\303\251A\t||a'b"},
    {"{{ messages|length }}{% for m in messages %}{% if m.content is string %}S{% elif m.content is iterable %}I{% else %}N{% endif %}{% endfor %}",
     "5SSNSI"},
    {"{% for m in messages %}{% if m.tool_calls is defined %}{% for tc in m.tool_calls %}{{ tc.function.name }}({{ tc.function.arguments|tojson }}){% endfor %}{% endif %}{% endfor %}",
     "f({\"a\": 1, \"b\": [1.5, \"x\"]})"},
    {"{{ '%s-%d-%.2f'|format('a', 3, 1.234) }}|{{ 'x=%s' % 5 }}|{{ '%s,%s' % (1, 2) }}",
     "a-3-1.23|x=5|1,2"},
    {"{% with a = 5 %}{{ a }}{% endwith %}{{ a }}",
     "5"},
    {"{% for i in range(3) %}{{ loop.cycle('a','b') }}{{ loop.previtem }}{{ loop.nextitem }}{% endfor %}",
     "a1b02a1"},
    {"{{ x|string + 'a' }} {{ (x ~ '')|length }} {{ -x }} {{ +x }} {{ not x }}",
     "3a 1 -3 3 False"},
    {"{{ 'ab' < 'b' }}{{ 2 <= 2.0 }}{{ [1,2] < [1,3] }}",
     "TrueTrueTrue"},
    {"{{ messages|map(attribute='role')|unique|list }}|{{ messages|map(attribute='name', default='anon')|list }}",
     "['system', 'user', 'assistant', 'tool']|['anon', 'anon', 'anon', 'anon', 'anon']"},
    {"{% set x = 10 %}{% macro show() %}{{ x }}{% endmacro %}{{ show() }}",
     "10"},
    {"{{ '\\n'.join(['a','b']) }}|{{ 'abc'.find('c') }}|{{ 'a-b-c'.rsplit('-', 1) }}|{{ 'abcabc'.count('b') }}",
     "a\nb|2|['a-b', 'c']|2"},
    {"{{ l|join }}|{{ messages|join(',', attribute='role') }}",
     "312|system,user,assistant,tool,user"},
    {"{{ 10|round(-1) }}|{{ 1.23456|round(3, 'floor') }}|{{ 3.7|int }}|{{ 'abc'|int }}|{{ 'abc'|int(7) }}",
     "10|1.234|3|0|7"},
    {"{{ 'x'|center(7) }}|{{ {'a':1}|dictsort(by='value') }}",
     "   x   |[('a', 1)]"},
    {"{{ f ~ '' }} {{ 1.0 }} {{ 100.0 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.5 }} {{ 3.14159 }} {{ 1/3 }} {{ 2/3 }}",
     "2.5 1.0 100.0 1e+16 1000000000000000.0 0.0001 1e-05 -0.5 3.14159 0.3333333333333333 0.6666666666666666"},
    {"{{ l|tojson(indent=4) }}{{ messages[2]|tojson(indent=2) }}",
     "[\n    3,\n    1,\n    2\n]{\n  \"role\": \"assistant\",\n  \"content\": null,\n  \"tool_calls\": [\n    {\n      \"type\": \"function\",\n      \"function\": {\n        \"name\": \"f\",\n        \"arguments\": {\n          \"a\": 1,\n          \"b\": [\n            1.5,\n            \"x\"\n          ]\n        }\n      }\n    }\n  ]\n}"},
    {"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}{{ loop_messages|length }}",
     "4"},
    {"{{ s|trim('  H') }}|{{ '  x  '|trim }}|{{ 'x'|indent }}",
     "ello World|x|x"},
    {"{{ x if x is defined else 0 }}{{ q.w if q is defined }}",
     "3"},
    {"{% for a in 'ab' %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}{% endfor %}",
     "1ax 2ay 11bx 2by 2"},
    {"{{ none|string }}{{ none|tojson }}{{ true|tojson }}{{ '\\u2028'|tojson }}",
     "Nonenulltrue\"\342\200\250\""},
    {"{{ [1,2,3][1:2] }}{{ (1,2,3)[1:] }}{{ 'abc'[-1] }}{{ 'abc'[10] }}",
     "[2](2, 3)c"},
    {"{%- set x = 'a' -%}\n\n  {{ x }}  \n\n{%- if x -%}\n   B\n{%- endif %}\n  after",
     "aB  after"},
    {"{{ u.upper() }} {{ '\303\211COLE'.lower() }} {{ '\303\251'|upper }}",
     "\345\244\232\350\260\242\357\274\201 \303\251cole \303\211"},
    {"{{ d|length }}{{ d|list }}{{ d|first }}",
     "2['b', 'a']b"},
    {"{{ messages[-1].content[0].text }}{{ messages[-1]['content'][1]['type'] }}",
     "partimage"},
    {"{{ [1, 2, 3]|sum(start=10) }}{{ [{'a': 1}, {'a': 2}]|sum(attribute='a') }}{{ [{'a': 3}, {'a': 2}]|sort(attribute='a')|map(attribute='a')|list }}",
     "163[2, 3]"},
    {"{{ 'a' is lower }}{{ 'A' is upper }}{{ range is callable }}{{ x is sameas 3 }}{{ n is sameas none }}",
     "TrueTrueTrueTrueTrue"},
    {"{% for x in [1,2] %}{% set outer = x %}{% endfor %}{{ outer }}",
     ""},
    {"{% macro m() %}{{ v }}{% endmacro %}{% set v = 1 %}{{ m() }}",
     "1"},
    {"{% for i in [1,2] %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}{% endfor %}",
     "12"},
    {"{% set x = 1 %}{% macro m() %}{% set x = 2 %}{{ x }}{% endmacro %}{{ m() }}{{ x }}",
     "21"},
    {"{% macro m() %}{{ v }}{% endmacro %}{% for i in [1] %}{% set v = 5 %}[{{ m() }}]{% endfor %}",
     "[]"},
    {"{% for m in messages %}{{ messages[loop.index:]|length }}{% endfor %}",
     "43210"},
    {"{{ (d.required or []) }}{{ (d.nothing or []) }}{{ '\"' + ['a','b']|join('\" | \"') + '\"' }}",
     "[][]\"a\" | \"b\""},
    {"{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}{% endmacro %}{{ fact(4) }}",
     "4*3*2*1"},
    {"{% macro m() %}[{{ caller(1, 2) }}]{% endmacro %}{% call(a, b) m() %}{{ a + b }}{% endcall %}",
     "[3]"},
    {"{% if x is defined and x.y is defined %}y{% else %}n{% endif %}",
     "n"},
    {"{{ '\303\251</tag>&'|tojson }}{{ d|items|list }}",
     "\"\303\251</tag>&\"[('b', 1), ('a', 2)]"},
    {"{% for message in messages %}{% set content = message.content if message.content is string else message.content|selectattr('text', 'defined')|map(attribute='text')|join %}{{ content }}|{% endfor %}",
     "Sys|Hi 'there'||r|part|"},
    {"{{ messages[0].content|default('') }}{{ n|default('') }}",
     "SysNone"},
    {"{{ [1, 2, ] }}{{ {'a': 1, } }}",
     "[1, 2]{'a': 1}"},
    {"{{ messages|selectattr('tool_calls')|list|length }}",
     "1"},
    {"A\n{%- if x -%}\n  B\n{%- endif -%}\nC\n{{- ' D ' -}}\n E",
     "ABC D E"},
    {"{% if not x is none %}ok{% endif %}{% if x is not defined %}no{% endif %}",
     "ok"},
    {"{% set ns = namespace(a=[1], b='s') %}{{ ns }}{% set ns.a = ns.a + [2] %}{{ ns.a }}",
     "<Namespace {'a': [1], 'b': 's'}>[1, 2]"},
    {"{{ messages|map(attribute='content')|select('string')|list }}",
     "['Sys', \"Hi 'there'\", 'r']"},
    {"{% for i in range(messages|length - 1, -1, -1) %}{{ messages[i].role[0] }}{% endfor %}",
     "utaus"},
    {"{% for m in messages %}{% if 'tool_calls' in m and m.tool_calls %}T{% endif %}{% endfor %}",
     "T"},
    {"{{ (x|string).rstrip() }}{{ '\\n' ~ x }}",
     "3\n3"},
    {"{{ '%.2f' % 3.14159 }}{{ '%5s|%-4d|' % ('ab', 7) }}",
     "3.14   ab|7   |"},
    {"{{ d.items()|list }}{{ {'a':1}.a }}{{ {'a': 1, 'b': none}|tojson }}",
     "[('b', 1), ('a', 2)]1{\"a\": 1, \"b\": null}"},
    {"{%- for m in messages %}\n    {%- if m.role == 'user' %}\n        {{- 'U' }}\n    {%- elif m.role == 'assistant' %}\n        {{- 'A' }}\n    {%- endif %}\n{%- endfor %}\n",
     "UAU"},
    {"{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}{{ loop.index }}{% else %}none{% endfor %}",
     "1"},
    {"{{ messages|rejectattr('content', 'string')|map(attribute='role')|list }}",
     "['assistant', 'user']"},
    {"{{ d|length }}{{ d.props|length }}{{ tools|length > 0 }}",
     "20False"},
    {"{% set s %}\n  a\n  {% if x %}b{% endif %}\n{% endset %}{{ s|trim }}|{{ s }}",
     "a\nb|  a\nb"},
    {"{{ 'Hello %s' | format('W') }}{{ 'x'.join(['a','b']) }}",
     "Hello Waxb"},
    {"{{ x ~ 'a' if x else 'b' }}",
     "3a"},
    {"{{ 1 if x == 1 else 2 if x == 2 else 3 }}",
     "3"},
    {"{{ -1|abs }}{{ 2**3**2 }}{{ 10 - 2 - 3 }}{{ 2 * 3 + 4 }}{{ 7 / 2 * 2 }}",
     "1645107.0"},
    {"{{ messages[-1]['content'][0]['text'] }}{{ messages[-1].content[1].type }}",
     "partimage"},
    {"{% for k in d.props %}{{ loop.index }}{{ k }}{% endfor %}",
     ""},
    {"{{ 'abc'|batch(2)|list }}",
     "[['a', 'b'], ['c']]"},
    {"{% if messages %}{% for m in messages if m.role == 'user' %}{% if loop.last %}{{ m.content is string }}{% endif %}{% endfor %}{% endif %}",
     "False"},
    {"{{ 'a' in messages[1] }}{{ 'role' in messages[1] }}",
     "FalseTrue"},
    {"{{ x is in [1, 2] }}{{ x is sameas true }}{{ true is sameas true }}",
     "FalseFalseTrue"},
    {"{{ messages[4].content|map(attribute='type')|join(', ') }}",
     "text, image"},
    {"{%- for tool in tools %}{{ tool | tojson(indent=2) }}{% endfor %}",
     ""},
    {"{% if x %}\n    text\n{% endif %}\n  {% for i in range(2) %}\n  - {{ i }}\n  {% endfor %}\nend",
     "    text\n  - 0\n  - 1\nend"},
    {"  {# c #}  \n  {%- set q = 1 %}  x",
     "  x"},
    {"{{ 'abc' | replace('', '-') }}{{ 'aaa' | replace('a', 'b', 2) }}",
     "-a-b-c-bba"},
    {"{{ '  a  b  '.split() }}{{ 'a  b'.split(' ') }}{{ ''.split(',') }}{{ ''.split() }}",
     "['a', 'b']['a', '', 'b'][''][]"},
    {"{{ 3.0|int }}{{ '0x1A'|int(0, 16) }}{{ '12'|int(base=8) }}",
     "32610"},
    /* a base int() refuses: Jinja falls back to int(float(value)), then the default */
    {"{{ '12'|int(0, 1) }}{{ '12'|int(0, 37) }}{{ '1.5'|int(0, true) }}{{ 'z'|int(7, -2) }}",
     "121217"},
    {"{{ \"<a>\"|safe ~ \"<b>\" }}",
     "<a><b>"},
    {"{{ \"<a>\"|safe + \"<b>\" }}",
     "<a>&lt;b&gt;"},
    {"{{ \"<b>\" + \"<a>\"|safe }}",
     "&lt;b&gt;<a>"},
    {"{{ (\"<a>\"|safe + \"<b>\")|upper }}",
     "<A>&LT;B&GT;"},
    {"{{ (\"<a>\"|safe|trim) + \"<\" }}",
     "<a>&lt;"},
    {"{{ \"<\"|e }}{{ \"<\"|e|e }}{{ (\"<\"|e + \"<\") }}",
     "&lt;&lt;&lt;&lt;"},
    {"{% macro m() %}<{% endmacro %}{{ m() + \"<\" }}",
     "<<"},
    {"{{ \"<\"|safe|string + \"<\" }}",
     "<&lt;"},
    {"{{ \"<\"|safe * 2 + \"<\" }}",
     "<<&lt;"},
    {"{{ \"<\"|safe|tojson }}",
     "\"<\""},
    {"{{ \"<\"|safe|length }}",
     "1"},
    {"{{ ([\"<\"|safe]|join) + \"<\" }}",
     "<<"},
    {"{{ \"<\"|safe == \"<\" }}",
     "True"},
    {"{% set x %}<{% endset %}{{ x + \"<\" }}",
     "<<"},
    {"{{ \"<\"|safe|indent + \"<\" }}",
     "<&lt;"},
    {"{{ \"<\"|safe|lower + \"<\" }}",
     "<&lt;"},
    {"{{ \"<\"|safe|title + \"<\" }}",
     "<<"},
    {"{{ \"'&\\\"\"|e }}",
     "&#39;&amp;&#34;"},
    {"{{ \"<\"|forceescape|forceescape }}",
     "&amp;lt;"},
    {"{% if []|select %}T{% endif %}{% if []|map(\"upper\") %}M{% endif %}{% if [] %}L{% endif %}",
     "TM"},
    {"{{ (l|select) is sequence }}{{ l|select is iterable }}",
     "FalseTrue"},
    {"{{ l|select|list|length }}",
     "3"},
    {"{{ l|reverse|list }}{{ l|reverse|join(\",\") }}",
     "[2, 1, 3]2,1,3"},
    {"{% set g = l|select %}{% for x in g %}{{ x }}{% endfor %}|{% for x in g %}{{ x }}{% endfor %}",
     "312|"},
    {"{{ l|select|first }}",
     "3"},
    {"{{ l|unique|list }}{{ l|batch(2)|list }}",
     "[3, 1, 2][[3, 1], [2]]"},
    {"{{ d|items|list }}{% for k, v in d|items %}{{ k }}{% endfor %}",
     "[('b', 1), ('a', 2)]ba"},
    {"{{ (l|select)[0] }}",
     ""},
    {"{{ l|select|sort }}",
     "[1, 2, 3]"},
    {"{{ l|select|sum }}{{ l|select|max }}",
     "63"},
    {"{{ l|reverse|reverse }}",
     "[3, 1, 2]"},
    {"{{ msgs|selectattr(\"role\", \"eq\", \"user\")|map(attribute=\"content\")|join }}",
     "a"},
    {"{{ msgs|map(attribute=\"role\")|list|tojson }}",
     "[\"user\", \"assistant\"]"},
    {"{% for m in msgs|selectattr(\"role\",\"equalto\",\"user\") %}{{ loop.length }}{{ loop.last }}{% endfor %}",
     "1True"},
    {"{{ l|select == l }}",
     "False"},
    {"{{ 1 in l|select }}",
     "True"},
    {"{{ 1 < x < 5 }}{{ 1 < x < 2 }}{{ 3 == x == 3 }}{{ 1 < 2 > 1 < 0 }}{{ (1 < 2) < 3 }}{{ x in l in [l] }}",
     "TrueFalseTrueFalseTrueTrue"},
    {"{{ 0.1 is odd }}{{ 3.0 is odd }}{{ 4.0 is even }}{{ 4.5 is divisibleby 1.5 }}",
     "FalseTrueTrueTrue"},
    {"{{ 'abc' % l }}{{ 'abc' % d }}{{ '%s' % [1, 2] }}",
     "abcabc[1, 2]"},
    {"{{ (1, 'x') is lower }}{{ d is lower }}{{ missing is callable }}{{ 'ABC' is upper }}",
     "TrueTrueTrueTrue"},
    {"{{ 0x1F }}{{ 0o17 }}{{ 0b101 }}{{ 0X_ff }}{{ 1_000 }}{{ 01.5 }}{{ 00 }}{{ 0e3 }}",
     "3115525510001.500.0"},
    {"{{ 'The quick brown fox jumps'|truncate(9) }}|{{ 'The quick brown fox jumps'|truncate(9, true) }}|{{ 'h\303\251llo w\303\266rld again'|truncate(8, leeway=0) }}",
     "The...|The qu...|h\303\251llo..."},
    {"{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{% endmacro %}{{ m(1, 2, 3) }}",
     "12(3,)"},
    {"{% macro m(a, b=2) %}{{ a }}{{ b }}{{ kwargs }}{% endmacro %}{{ m(1, c=3) }}",
     "12{'c': 3}"},
    {"{% macro m(a, b=2) %}{{ a }}{{ b }}{% endmacro %}{{ m(b=5, a=3) }}{{ m() }}",
     "352"},
    {"{% macro m() %}[{{ caller() }}]{% endmacro %}{% call m() %}x{% endcall %}",
     "[x]"},
    {"{% macro outer() %}{% macro inner() %}{{ kwargs }}{% endmacro %}{{ inner(z=1) }}{% endmacro %}{{ outer() }}",
     "{'z': 1}"},
    {"{{ '{\\n'|indent(4, first=true) }}|{{ 'a'|indent(2) }}|{{ ''|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2) }}|{{ 'a\\n\\nb\\n'|indent(2, blank=true) }}|{{ 'x\\r\\ny\\rz'|indent(1) }}|{{ '\\n'|indent(3, true, true) }}",
     "    {\n|a|  |a\n\n  b|a\n  \n  b\n  |x\n y\n z|   \n   "},
};

static void test_table(void) {
    for (size_t i = 0; i < LOOM_ARRAY_LEN(CASES); i++) CHECK_RENDER(CASES[i][0], VARS_JSON, CASES[i][1]);
}

/* trim_blocks and lstrip_blocks exactly as transformers sets them. */
static void test_whitespace(void) {
    CHECK_RENDER("A\n  {% if true %}\n    B\n  {% endif %}\nC", NULL, "A\n    B\nC");
    /* {%+ keeps the indentation, +%} keeps the newline */
    CHECK_RENDER("A\n  {%+ if true %}\nB\n{% endif +%}\nC", NULL, "A\n  B\n\nC");
    /* comments are stripped like blocks */
    CHECK_RENDER("a\n  {# note #}\nb", NULL, "a\nb");
    /* {{ }} is not a block: neither trimmed nor lstripped */
    CHECK_RENDER("a\n  {{ 'x' }}\nb", NULL, "a\n  x\nb");
    CHECK_RENDER("a  {{- 'x' -}}  \n b", NULL, "axb");
    CHECK_RENDER("a \n{%- if true -%}\n b {% endif %}", NULL, "ab ");
    /* lstrip only when the tag starts its line */
    CHECK_RENDER("x  {% if true %}y{% endif %}", NULL, "x  y");
    /* one trailing newline of the source is dropped, not two */
    CHECK_RENDER("a\n\n", NULL, "a\n");
    CHECK_RENDER("a\r\nb\r\n", NULL, "a\nb");
    CHECK_RENDER("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
}

static void test_values(void) {
    /* JSON ints stay ints, floats keep their repr, key order is kept */
    CHECK_RENDER("{{ a }} {{ b }} {{ c|tojson }} {{ c }}", "{\"a\": 1, \"b\": 1.0, \"c\": {\"z\": 1e-7, \"y\": [true, null]}}",
                 "1 1.0 {\"z\": 1e-07, \"y\": [true, null]} {'z': 1e-07, 'y': [True, None]}");
    CHECK_RENDER("{{ s|tojson }}|{{ [s] }}", "{\"s\": \"\\u00e9\\\"'\\n\\u0001\"}",
                 "\"\303\251\\\"'\\n\\u0001\"|['\303\251\"\\'\\n\\x01']");
    CHECK_RENDER("{{ t|tojson(indent=2) }}", "{\"t\": {\"a\": [1, {}], \"b\": []}}",
                 "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
    CHECK_RENDER("{{ 'x'|tojson(ensure_ascii=true) }}{{ '\\u00e9\\U0001F600'|tojson(ensure_ascii=true) }}",
                 NULL, "\"x\"\"\\u00e9\\ud83d\\ude00\"");
}

static void test_errors(void) {
    const loom_status F = LOOM_ERR_FORMAT, I = LOOM_ERR_INVALID_ARG;
    /* malformed templates fail to compile, naming the line */
    CHECK_FAIL("a\nb\n{% if x %}\nunclosed", NULL, F, "line 4: unexpected end of template: 'if' opened at line 3");
    CHECK_FAIL("{% for x in y %}{% endif %}", NULL, F, "unexpected 'endif', expected 'endfor'");
    CHECK_FAIL("\n{{ x | nosuchfilter }}", NULL, F, "line 2: no filter named 'nosuchfilter'");
    CHECK_FAIL("{{ x is nosuchtest }}", NULL, F, "no test named 'nosuchtest'");
    CHECK_FAIL("{% nosuchtag %}", NULL, F, "unknown tag 'nosuchtag'");
    CHECK_FAIL("{{ 'abc }}", NULL, F, "unterminated string");
    CHECK_FAIL("{{ 1 +* 2 }}", NULL, F, "line 1: unexpected '*'");
    CHECK_FAIL("{{ x", NULL, F, "tag not closed");
    CHECK_FAIL("{# x", NULL, F, "unclosed comment");
    CHECK_FAIL("{% break %}", NULL, F, "'break' outside of a loop");
    CHECK_FAIL("{{ f(a=1, 2) }}", NULL, F, "positional argument follows keyword argument");
    CHECK_FAIL("{% set x %}", NULL, F, "expected 'endset'");
    CHECK_FAIL("{{ (1, 2 }}", NULL, F, "line 1");
    CHECK_FAIL("{% else %}", NULL, F, "unexpected 'else'");
    CHECK_FAIL("{{ }}", NULL, F, "unexpected '}}'");
    CHECK_FAIL("{{ 'a' +}}", NULL, F, "unexpected '}}'");
    /* unknown names inside if blocks and conditional expressions fail only
     * when reached, like Jinja; elsewhere at compile time */
    CHECK_RENDER("{% if false %}{{ x|nosuch }}{% endif %}{{ 1 if true else x|nosuch }}", NULL, "1");
    CHECK_FAIL("{% if true %}{{ x|nosuch }}{% endif %}", NULL, I, "unknown filter 'nosuch'");
    CHECK_FAIL("{% if false %}{% for a in b %}{{ a|nosuch }}{% endfor %}{% endif %}", NULL, F,
               "no filter named 'nosuch'");
    CHECK_FAIL("{{ x|tojson(indentx=2) }}", NULL, I, "unexpected keyword argument 'indentx'");
    CHECK_FAIL("{{ x is defined(1) }}", NULL, I, "takes no arguments");
    CHECK_FAIL("{{ a.b.c }}", NULL, I, "line 1: 'a' is undefined");
    /* render-time errors name the line too */
    CHECK_FAIL("ok\n{{ 1 + 'a' }}", NULL, I, "line 2: unsupported operand type(s) for +: 'int' and 'str'");
    CHECK_FAIL("{{ 1 // 0 }}", NULL, I, "division or modulo by zero");
    CHECK_FAIL("{{ 1 < 'a' }}", NULL, I, "'<' not supported between instances of 'int' and 'str'");
    CHECK_FAIL("{{ none|length }}", NULL, I, "has no len()");
    CHECK_FAIL("{% for x in 3 %}{% endfor %}", NULL, I, "'int' object is not iterable");
    CHECK_FAIL("{{ x|tojson }}", NULL, I, "not JSON serializable");
    CHECK_FAIL("{{ 'x'|wordwrap(3) }}", NULL, I, "filter 'wordwrap' is not supported");
    CHECK_FAIL("{% set a, b = [1] %}", NULL, I, "cannot unpack");
    CHECK_FAIL("{% set n = 1 %}{% set n.a = 2 %}", NULL, I, "non-namespace");
    CHECK_FAIL("{{ range(1000000)|length }}", NULL, I, "range too big");
    CHECK_FAIL("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", NULL, I, "recursion too deep");
    /* raise_exception: the message is the template's own */
    CHECK_FAIL("{{ raise_exception('Roles must alternate') }}", NULL, I, "Roles must alternate");
    CHECK_STR(loom_last_error(), "Roles must alternate");
    CHECK(loom_jinja_last_error_raised());
    loom_status st;
    char *out = render("{{ 1 + 'a' }}", NULL, &st);
    CHECK(!out && !loom_jinja_last_error_raised());
    /* bad variables */
    CHECK_FAIL("x", "[1]", I, "expected a JSON object");
    CHECK_FAIL("x", "{\"a\": ", I, "bad JSON");
}

/* Hostile inputs must fail cleanly, never crash. */
static void test_robustness(void) {
    static const char *const bad[] = {
        "{{", "{%", "{#", "{{ (", "{{ [", "{{ {", "{{ a[", "{{ a[1:2:3:4] }}", "{{ a. }}",
        "{% for %}", "{% for x %}", "{% for x in %}", "{% if %}", "{% set = 1 %}",
        "{% macro %}", "{% macro m( %}", "{% call %}", "{% filter %}", "{{ 'a' is }}",
        "{{ a | }}", "{{ a(b=) }}", "{% endfor %}", "}}", "%}", "{{ 1 if }}",
        "{{ x is not }}", "{% raw %}", "{{ '\\", "{{ \"\\u12 }}", "{{ 9999999999999999999999 }}",
        "{% for a, in b %}{% endfor %}", "{% set (a, b) = (1, 2) %}{{ a }}{{ b }}",
        "{{ [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]] }}",
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(bad); i++) {
        loom_status st;
        char *out = render(bad[i], "{\"b\": [[1]]}", &st);
        CHECK((out != NULL) == (st == LOOM_OK));
        free(out);
    }
    /* deep nesting and long loops stay bounded */
    char deep[4096];
    size_t n = 0;
    for (int i = 0; i < 60; i++) n += (size_t)snprintf(deep + n, sizeof deep - n, "(");
    n += (size_t)snprintf(deep + n, sizeof deep - n, "1");
    for (int i = 0; i < 60; i++) n += (size_t)snprintf(deep + n, sizeof deep - n, ")");
    char src[4200];
    snprintf(src, sizeof src, "{{ %s }}", deep);
    loom_status st;
    char *out = render(src, NULL, &st);
    CHECK(out && !strcmp(out, "1"));
    free(out);
    CHECK_RENDER("{% for i in range(300) %}{% for j in range(300) %}{% endfor %}{% endfor %}ok", NULL, "ok");
    /* nesting that would exhaust the stack is refused at compile time */
    static char huge[300000];
    size_t k = 0;
    k += (size_t)snprintf(huge + k, sizeof huge - k, "{{ ");
    for (int i = 0; i < 100000; i++) huge[k++] = '(';
    huge[k++] = '1';
    for (int i = 0; i < 100000; i++) huge[k++] = ')';
    snprintf(huge + k, sizeof huge - k, " }}");
    CHECK_FAIL(huge, NULL, LOOM_ERR_FORMAT, "nested too deeply");
    k = (size_t)snprintf(huge, sizeof huge, "{{ 1");
    for (int i = 0; i < 5000; i++) k += (size_t)snprintf(huge + k, sizeof huge - k, " + 1");
    snprintf(huge + k, sizeof huge - k, " }}");
    CHECK_FAIL(huge, NULL, LOOM_ERR_FORMAT, "expression too long");
    k = 0;
    for (int i = 0; i < 2000; i++) k += (size_t)snprintf(huge + k, sizeof huge - k, "{%% if true %%}");
    CHECK_FAIL(huge, NULL, LOOM_ERR_FORMAT, "too deeply");
    k = (size_t)snprintf(huge, sizeof huge, "{{ x");
    for (int i = 0; i < 5000; i++) k += (size_t)snprintf(huge + k, sizeof huge - k, "|trim");
    snprintf(huge + k, sizeof huge - k, " }}");
    CHECK_FAIL(huge, NULL, LOOM_ERR_FORMAT, "nested too deeply");
    /* a list holding itself neither loops nor crashes */
    out = render("{% set a = [] %}{% set _ = a.append(a) %}{{ a|length }}{{ a == a }}{{ a|string|length > 0 }}",
                 NULL, &st);
    CHECK(out && !strcmp(out, "1TrueTrue"));
    free(out);
}

/* Inputs a fuzzer found: a float literal longer than the parser's buffer,
 * and slicing strings that are not valid UTF-8. */
static void test_fuzz_regressions(void) {
    char src[200] = "{{ ";
    for (int i = 0; i < 127; i++) strcat(src, "1");
    strcat(src, ".0 }}");
    CHECK_FAIL(src, "{}", LOOM_ERR_FORMAT, "numeric literal");
    CHECK_RENDER("{{ 12345678901234567890.5 > 1 }}", "{}", "True");
    /* a stray byte counts as one character, consistently */
    loom_status st;
    char *out = render("{{ \"a\x8f\x8f\"[1:] }}|{{ s[1:] }}|{{ s[::-1] }}|{{ s | length }}",
                       "{\"s\": \"xyz\"}", &st);
    CHECK(st == LOOM_OK && out && !strcmp(out, "\x8f\x8f|yz|zyx|3"));
    free(out);
    out = render("{{ \"a\x8f\x8f\"[::-1] }}|{{ \"\x8f\" | length }}", "{}", &st);
    CHECK(st == LOOM_OK && out && !strcmp(out, "\x8f\x8f" "a|1"));
    free(out);
}

int main(void) {
    test_fuzz_regressions();
    test_table();
    test_whitespace();
    test_values();
    test_errors();
    test_robustness();
    return test_report("test_jinja");
}
