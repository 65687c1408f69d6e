/* Grammars: GBNF parsing and its errors, regexes, JSON Schema features
 * (each with strings it must accept and reject), and token masks checked
 * against a brute-force reference over a small vocabulary and the bundled
 * model's vocabulary, from random reachable states. */
#include <cjson/cJSON.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <sys/wait.h>
#include <unistd.h>

#include "grammar/grammar.h"
#include "test.h"
#include "tokenize/tokenizer.h"

static loom_grammar *gbnf(const char *text) {
    loom_grammar *g;
    char err[256];
    loom_status st = loom_grammar_from_gbnf(text, NULL, &g, err, sizeof err);
    CHECKF(st == LOOM_OK, "%s: %s", text, err);
    return st ? NULL : g;
}

static loom_grammar *schema(const char *text) {
    loom_grammar *g;
    char err[256];
    loom_status st = loom_grammar_from_schema(text, NULL, &g, err, sizeof err);
    CHECKF(st == LOOM_OK, "%s: %s", text, err);
    return st ? NULL : g;
}

/* accepts: strings in the language; rejects: strings not in it. */
static void lang(loom_grammar *g, const char *what, const char *const *acc, const char *const *rej) {
    if (!g) return;
    for (; acc && *acc; acc++) CHECKF(loom_grammar_accepts(g, *acc, strlen(*acc)), "%s should accept %s", what, *acc);
    for (; rej && *rej; rej++) CHECKF(!loom_grammar_accepts(g, *rej, strlen(*rej)), "%s should reject %s", what, *rej);
    loom_grammar_release(g);
}

#define L(...) (const char *const[]){__VA_ARGS__, NULL}

static void gbnf_errors(void) {
    static const struct {
        const char *text, *msg;
    } cases[] = {
        {"", "expected a rule"},
        {"root ::= foo", "rule 'foo' is used but not defined"},
        {"root ::= \"a", "expected '\"' closing the literal"},
        {"root ::= [a-", "expected"},
        {"root ::= (\"a\"", "expected ')'"},
        {"root ::= \"a\"{3,1}", "max below min"},
        {"root ::= root \"a\"", "left-recursive"},
        {"root ::= x\nx ::= \"\"? root", "left-recursive"},
        {"a ::= \"x\"", "no rule named 'root'"},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
        {"root ::= \"\\xZZ\"", "hex digits"},
        {"root ::= [z-a]", "ends below its start"},
        {"root ::= !", "expected a literal"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        loom_grammar *g = NULL;
        char err[256] = "";
        loom_status st = loom_grammar_from_gbnf(cases[i].text, NULL, &g, err, sizeof err);
        CHECKF(st != LOOM_OK && !g, "%s compiled", cases[i].text);
        CHECKF(strstr(err, cases[i].msg) != NULL, "%s: '%s' lacks '%s'", cases[i].text, err, cases[i].msg);
    }
    char err[256] = "";
    loom_grammar *g = NULL;
    loom_grammar_from_gbnf("root ::= \"a\"\n  | \"b\" foo\n", NULL, &g, err, sizeof err);
    CHECKF(strstr(err, "line 2") != NULL, "line of an undefined rule: %s", err);
}

static void gbnf_lang(void) {
    lang(gbnf("root ::= \"a\" | \"bc\""), "alt", L("a", "bc"), L("", "b", "abc", "ab"));
    lang(gbnf("root ::= [a-c]+ \"!\"?"), "plus", L("a", "abc!", "cc"), L("", "!", "ad"));
    lang(gbnf("root ::= (\"ab\")* \"x\"{2,3}"), "star", L("xx", "abxxx", "ababxx"), L("x", "abxxxx", "axx"));
    lang(gbnf("root ::= [^a]"), "neg", L("b", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"), L("a", "\xc3", "\xff"));
    lang(gbnf("root ::= [\\u00e0-\\u00ff\\u4e00]"), "unicode", L("\xc3\xa0", "\xc3\xbf", "\xe4\xb8\x80"), L("\xc3\x9f", "a"));
    lang(gbnf("root ::= .{2}"), "dot", L("ab", "\xc3\xa9z"), L("a", "abc"));
    lang(gbnf("# comment\nroot ::= item (\",\" item)*  # trailing\nitem ::= [0-9]{1,2}\n"), "rules",
         L("1", "1,23", "4,5,66"), L("1,", "123", ",1"));
    lang(gbnf("root ::= expr\nexpr ::= term (\"+\" term)*\nterm ::= [0-9] | \"(\" expr \")\""), "recursive",
         L("1", "(1+2)+3", "((4))"), L("(1", "1+", "()"));
    lang(gbnf("root ::= \"\\n\\t\\\\\\\"\""), "escapes", L("\n\t\\\""), L("n"));
}

static loom_grammar *regex(const char *re) {
    loom_grammar *g;
    char err[256];
    loom_status st = loom_grammar_from_regex(re, NULL, &g, err, sizeof err);
    CHECKF(st == LOOM_OK, "%s: %s", re, err);
    return st ? NULL : g;
}

static void regexes(void) {
    lang(regex("^[a-z]+@[a-z]+\\.(com|org)$"), "email", L("a@b.com", "xy@zz.org"), L("a@b.net", "@b.com", "a@b.comm"));
    lang(regex("\\d{3}-\\d{4}"), "phone", L("555-1234"), L("55-1234", "555-12345", "abc-defg"));
    lang(regex("(ab|c)*d?"), "group", L("", "abcab", "cd", "d"), L("a", "abd d"));
    lang(regex("[^\\s]{2,}x+?"), "classes", L("abx", "..xx"), L("a x", "x"));
    lang(regex("a{2,}"), "open", L("aa", "aaaaa"), L("a"));
    lang(regex("\\w\\W\\S\\."), "short", L("a-b.", "_ x."), L("a-b!", "-ab."));
    lang(regex("colou?r"), "opt", L("color", "colour"), L("colouur"));
    static const char *const bad[] = {"a(?=b)", "(ab", "a)", "*a", "a**", "[b-a]", "x{3,1}", "a^b", "\\p{L}", NULL};
    for (const char *const *b = bad; *b; b++) {
        loom_grammar *g = NULL;
        char err[256] = "";
        CHECKF(loom_grammar_from_regex(*b, NULL, &g, err, sizeof err) != LOOM_OK && err[0], "regex %s compiled", *b);
    }
}

/* A counted repetition is read by one parser for GBNF and regexes: the
 * same errors from both. */
static void repeat_counts(void) {
    static const struct { const char *rep, *msg; } cases[] = {
        {"{3,1}", "a repetition {3,1} with max below min"},
        {"{5000}", "a repetition count above 4096"},
        {"{2,x}", "expected a number in {m,n}"},
        {"{2", "expected '}' closing the repetition"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[64], err[256] = "", rerr[256] = "";
        loom_grammar *g = NULL;
        snprintf(text, sizeof text, "root ::= \"a\"%s", cases[i].rep);
        CHECK(loom_grammar_from_gbnf(text, NULL, &g, err, sizeof err) != LOOM_OK && !g);
        CHECKF(strstr(err, cases[i].msg) != NULL, "%s: '%s' lacks '%s'", text, err, cases[i].msg);
        snprintf(text, sizeof text, "a%s", cases[i].rep);
        CHECK(loom_grammar_from_regex(text, NULL, &g, rerr, sizeof rerr) != LOOM_OK && !g);
        CHECKF(strstr(rerr, cases[i].msg) != NULL, "regex %s: '%s' lacks '%s'", text, rerr, cases[i].msg);
    }
}

static void schemas(void) {
    lang(schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
                "\"required\":[\"name\"]}"),
         "object", L("{\"name\":\"a\"}", "{\"name\": \"b\", \"age\": 3}", "{ \"name\":\"\\u00e9\\n\",\n  \"age\":-12}"),
         L("{}", "{\"age\":3}", "{\"age\":3,\"name\":\"a\"}", "{\"name\":\"a\",}", "{\"name\":\"a\",\"x\":1}",
           "{\"name\":1}", "{\"name\":\"a\"} ", " {\"name\":\"a\"}", "{\"name\":\"a\",\"age\":1.5}"));
    lang(schema("{\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"}},\"additionalProperties\":true}"),
         "additional", L("{}", "{\"b\":null}", "{\"a\":true,\"zz\":[1,{}]}", "{\"q\":1,\"r\":\"s\"}"),
         L("{\"a\":true,}", "{\"zz\"}", "{\"q\":1 \"r\":2}"));
    /* a listed key comes once: never again as an extra key */
    lang(schema("{\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"}},\"additionalProperties\":true}"),
         "additional, listed once", L("{\"a\":true,\"b\":null,\"ab\":1,\"\":2}", "{\"b\":null,\"zz\":1}", "{\"a\":false,\"B\":1}"),
         L("{\"a\":true,\"a\":false}", "{\"b\":null,\"zz\":1,\"b\":null}", "{\"a\":true,\"a\":1}", "{\"a\":true,\"\\u0061\":1}"));
    lang(schema("{\"properties\":{\"n\":{\"type\":\"string\"}},\"additionalProperties\":{\"type\":\"integer\"},"
                "\"not\":{\"required\":[\"n\"]}}"), "additional schema, listed once",
         L("{\"m\":1}", "{}"), L("{\"n\":\"x\"}", "{\"m\":1,\"n\":3}"));
    lang(schema("{\"properties\":{\"n\":{\"type\":\"string\"}},\"additionalProperties\":{\"type\":\"integer\"}}"),
         "additional schema, listed key once", L("{\"n\":\"x\",\"m\":3}"), L("{\"n\":\"x\",\"n\":3}", "{\"n\":3}"));
    lang(schema("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}"), "map",
         L("{}", "{\"x\":1,\"y\":2}"), L("{\"x\":\"1\"}"));
    lang(schema("{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":1,\"maxItems\":3}"), "array",
         L("[1]", "[1.5, -2e3, 0]", "[ 0.25 ]"), L("[]", "[1,2,3,4]", "[01]", "[1,]", "[.5]"));
    lang(schema("{\"type\":\"array\",\"maxItems\":0}"), "empty array", L("[]", "[ ]"), L("[1]"));
    lang(schema("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}"), "length",
         L("\"ab\"", "\"\\n\\\"x\"", "\"\xc3\xa9\xc3\xa9\""), L("\"a\"", "\"abcd\"", "\"a\nb\""));
    lang(schema("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]+$\"}"), "pattern", L("\"AB-12\""),
         L("\"ab-12\"", "\"AB-\"", "AB-1"));
    lang(schema("{\"type\":\"string\",\"pattern\":\"^a.b$\"}"), "pattern json escape",
         L("\"axb\"", "\"a\\\"b\"", "\"a\\\\b\"", "\"a\\tb\""), L("\"a\"b\"", "\"a\\nb\""));
    lang(schema("{\"enum\":[\"red\",\"green\",3,null,{\"a\":[1]}]}"), "enum",
         L("\"red\"", "\"green\"", "3", "null", "{\"a\":[1]}"), L("\"blue\"", "4", "\"Red\""));
    lang(schema("{\"const\":\"x\\\"y\"}"), "const", L("\"x\\\"y\""), L("\"xy\""));
    lang(schema("{\"type\":\"string\",\"format\":\"date\"}"), "date", L("\"2024-02-29\"", "\"1999-12-31\""),
         L("\"2024-13-01\"", "\"24-01-01\"", "\"2024-00-10\""));
    lang(schema("{\"type\":\"string\",\"format\":\"time\"}"), "time", L("\"23:59:59Z\"", "\"08:00:00.5+02:00\""),
         L("\"24:00:00Z\"", "\"12:00\""));
    lang(schema("{\"type\":\"string\",\"format\":\"date-time\"}"), "date-time", L("\"2024-01-02T03:04:05Z\""),
         L("\"2024-01-02 03:04:05Z\""));
    lang(schema("{\"type\":\"string\",\"format\":\"uuid\"}"), "uuid", L("\"123e4567-e89b-12d3-a456-426614174000\""),
         L("\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400g\""));
    lang(schema("{\"type\":\"string\",\"format\":\"email\"}"), "email", L("\"a.b@c.io\"", "\"x+1@mail.example.com\""),
         L("\"a@b\"", "\"@b.com\"", "\"a b@c.com\""));
    lang(schema("{\"type\":\"integer\",\"minimum\":-15,\"maximum\":230}"), "int range",
         L("-15", "-9", "0", "7", "99", "100", "199", "230"), L("-16", "231", "300", "-0", "007", "1000"));
    lang(schema("{\"type\":\"integer\",\"exclusiveMinimum\":9,\"exclusiveMaximum\":1000}"), "exclusive",
         L("10", "999", "500"), L("9", "1000", "5"));
    lang(schema("{\"type\":\"integer\",\"minimum\":1}"), "min only", L("1", "123456789"), L("0", "-1"));
    lang(schema("{\"type\":\"number\",\"minimum\":0,\"maximum\":10}"), "number range",
         L("0", "9.99", "10", "10.0", "3"), L("10.5", "-1", "11"));
    lang(schema("{\"type\":\"number\",\"minimum\":-90,\"maximum\":90}"), "signed number range",
         L("-90", "-89.5", "0", "45.25", "90", "-0.5"), L("-90.5", "90.1", "91", "-100"));
    lang(schema("{\"type\":\"number\",\"exclusiveMinimum\":-1.5,\"maximum\":-0.5}"), "narrowed bounds",
         L("-1", "-1.0"), L("-1.5", "-0.5", "-2", "0"));
    lang(schema("{\"type\":\"number\",\"maximum\":-3}"), "max only", L("-3", "-4.5", "-100"), L("-2.5", "0", "3"));
    lang(schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]}"),
         "required outside properties", L("{\"a\":1,\"b\":[true]}"), L("{\"a\":1}", "{\"b\":1}"));
    lang(schema("{\"type\":\"string\",\"format\":\"ipv4\"}"), "ipv4", L("\"192.168.0.1\"", "\"0.0.0.0\""),
         L("\"256.1.1.1\"", "\"1.2.3\"", "\"01.2.3.4\""));
    lang(schema("{\"type\":\"string\",\"format\":\"uri\"}"), "uri", L("\"https://example.com/a/b.html\""),
         L("\"example.com\"", "\"http://\""));
    lang(schema("{\"type\":\"string\",\"minLength\":1,\"description\":\"x\",\"x-extension\":1,\"minProperties\":0}"),
         "annotations ignored", L("\"a\""), L("\"\""));
    lang(schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"string\"}},"
                "\"anyOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}"),
         "anyOf with siblings", L("{\"a\":\"x\"}", "{\"b\":\"y\"}", "{\"a\":\"x\",\"b\":\"y\"}"),
         L("{}", "{\"a\":1}", "{\"b\":[]}"));
    lang(schema("{\"type\":\"array\",\"uniqueItems\":true}"), "unique: one item at most", L("[]", "[1]"),
         L("[1,2]"));
    lang(schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},"
                "\"minProperties\":1}"),
         "minProperties", L("{\"a\":1}", "{\"a\":1,\"b\":2}"), L("{}", "{\"b\":2}"));
    lang(schema("{\"properties\":{\"a\":{},\"b\":{},\"c\":{}},\"required\":[\"a\"],"
                "\"dependencies\":{\"a\":[\"c\"],\"b\":[\"c\"]}}"),
         "dependencies", L("{\"a\":1,\"c\":2}"), L("{\"a\":1}", "{\"a\":1,\"b\":2,\"c\":3}"));
    lang(schema("{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},"
                "\"patternProperties\":{\"^x-[a-z]+$\":{\"type\":\"string\"}},\"additionalProperties\":true}"),
         "patternProperties", L("{\"id\":1}", "{\"id\":1,\"x-ab\":\"v\"}", "{\"x-q\":\"\",\"x-r\":\"s\"}"),
         L("{\"id\":1,\"x-ab\":2}", "{\"id\":1,\"y\":\"v\"}", "{\"x-1\":\"v\"}"));
    lang(schema("{\"type\":\"string\",\"maxLength\":100000}"), "maxLength capped", L("\"abc\""), L("1"));
    lang(schema("{\"type\":[\"string\",\"null\"]}"), "type list", L("\"a\"", "null"), L("1"));
    lang(schema("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"boolean\"}]}"), "anyOf", L("1", "true"), L("\"1\""));
    lang(schema("{\"oneOf\":[{\"const\":1},{\"const\":2}]}"), "oneOf", L("1", "2"), L("3"));
    lang(schema("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
                "{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}"),
         "allOf", L("{\"a\":1,\"b\":\"x\"}"), L("{\"a\":1}", "{\"b\":\"x\"}"));
    lang(schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},"
                "\"$ref\":\"#/$defs/node\"}"),
         "recursive ref", L("{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]}]}"),
         L("{\"v\":1,\"kids\":[{}]}", "{\"kids\":[]}"));
    lang(schema("{\"type\":\"object\"}"), "json_object", L("{}", "{\"a\":[1,2,{\"b\":null}],\"c\":\"d\"}"),
         L("[]", "1", "{\"a\"}", "{a:1}"));
    lang(schema("true"), "true", L("1", "\"x\"", "[null]"), L("x"));
    /* bounded whitespace: a newline and 20 spaces at most */
    /* a pattern's own lengths drop redundant bounds; a maximum too large
       for the product is lowered (a subset) */
    lang(schema("{\"type\":\"string\",\"pattern\":\"[a-z]{0,60}\",\"maxLength\":4000}"), "bound kept by the pattern",
         L("\"\"", "\"abc\""), L("\"A\""));
    lang(schema("{\"type\":\"string\",\"pattern\":\"[a-z]+\",\"maxLength\":4000}"), "maximum lowered",
         L("\"a\"", "\"abcdefghijklmnopqrstuvwxyz\""), L("\"\"", "\"A\""));
    lang(schema("{\"type\":\"array\"}"), "ws", L("[\n                    1]"), L("[\n                     1]", "[  1]"));
    static const struct {
        const char *s, *msg;
    } bad[] = {
        {"{\"type\":\"strin\"}", "unknown type 'strin'"},
        {"{\"$ref\":\"#/$defs/nope\"}", "no such place"},
        {"{\"$ref\":\"http://x/y.json\"}", "only references inside"},
        {"{\"type\":\"number\",\"minimum\":0.2,\"maximum\":0.8}", "holding no integer"},
        {"{\"type\":\"array\",\"prefixItems\":[]}", "prefixItems"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "lookaround"},
        {"{\"type\":\"object\",\"properties\":{},\"required\":[\"a\"],\"additionalProperties\":false}",
         "required property 'a'"},
        /* unsupported keywords name themselves and where they are */
        {"{\"properties\":{\"a/b\":{\"type\":\"array\",\"uniqueItems\":true,\"minItems\":2}}}",
         "'uniqueItems' with minItems 2 is not supported (at #/properties/a~1b)"},
        {"{\"properties\":{\"x-a\":{}},\"patternProperties\":{\"^x-\":{}}}", "property 'x-a' also matches"},
        {"{\"properties\":{\"a\":{}},\"dependencies\":{\"a\":{\"required\":[\"b\"]}}}",
         "'dependencies' is not supported (at #/dependencies)"},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"not\":{\"pattern\":\"a\"}}]}", "'not' over 'pattern' is not supported (loom writes the negation of type, enum, const, required, properties, anyOf, allOf and not) (at #/anyOf/1/not/pattern)"},
        {"{\"$defs\":{\"x\":{\"type\":\"integer\",\"multipleOf\":1001}},\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/x\"}}",
         "'multipleOf' 1001: loom writes multiples of at most 1000 times a power of ten (at #/$defs/x)"},
        {"{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":1,\"maximum\":4}", "no integer in [1, 4]"},
        {"{\"type\":\"string\",\"not\":{\"type\":\"string\"}}", "nothing validates against this schema and its 'not' (at #/not)"},
        {"{\"type\":\"string\",\"pattern\":\"a+\",\"not\":{\"const\":\"aa\"}}", "'not' of the string \"aa\" with 'pattern'"},
        {"{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"string\",\"pattern\":\"a(\"}}}", "(at #/properties/p/pattern)"},
        {"{\"type\":\"string\",\"format\":\"email\",\"maxLength\":3}", "'maxLength' together with 'format'"},
        {"{\"type\":\"string\",\"allOf\":[{\"format\":\"uri\"},{\"pattern\":\"^https?://\"}]}", "'pattern' together with 'format' uri"},
        {"{\"type\":\"string\",\"pattern\":\"[a-z]{3}\",\"maxLength\":2}", "no string of the length bounds matches 'pattern'"},
        {"{\"type\":\"string\",\"pattern\":\"[a-z]+x\",\"minLength\":1000}", "is too large"},
        {"{\"if\":{\"minLength\":2},\"then\":{\"maxLength\":5}}", "'if' is supported when loom can write its negation"},
        {"false", "matches nothing"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "holds no integer"},
        {"{", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        loom_grammar *g = NULL;
        char err[256] = "";
        CHECKF(loom_grammar_from_schema(bad[i].s, NULL, &g, err, sizeof err) != LOOM_OK && !g, "%s compiled", bad[i].s);
        CHECKF(strstr(err, bad[i].msg) != NULL, "%s: '%s' lacks '%s'", bad[i].s, err, bad[i].msg);
    }
}

/* ---- not, multipleOf, if/then/else, oneOf: property checks -------------------
 * Each schema's language is checked against a predicate that says what
 * validates: random instances must be accepted, random non-instances
 * rejected (and, for a generator that writes a subset, every accepted
 * string must satisfy the predicate). */

static uint64_t prng = 0x9E3779B97F4A7C15ULL;
static uint32_t prnd(void) {
    prng ^= prng << 13, prng ^= prng >> 7, prng ^= prng << 17;
    return (uint32_t)(prng >> 11);
}

/* Integers: every n in [lo, hi] written plainly is accepted iff ok(n);
 * exact is 0 when the grammar writes a subset (then only accepted =>
 * ok is checked). */
static void int_prop(const char *sch, long lo, long hi, int (*ok)(long), int exact) {
    loom_grammar *g = schema(sch);
    if (!g) return;
    int acc = 0;
    for (long n = lo; n <= hi; n++) {
        char b[32];
        snprintf(b, sizeof b, "%ld", n);
        int a = loom_grammar_accepts(g, b, strlen(b));
        acc += a;
        if (exact) CHECKF(a == ok(n), "%s: %ld %s", sch, n, a ? "accepted" : "rejected");
        else CHECKF(!a || ok(n), "%s: %ld accepted", sch, n);
    }
    CHECKF(acc > 0, "%s: accepts nothing in [%ld, %ld]", sch, lo, hi);
    loom_grammar_release(g);
}

static int mul7_in(long n) { return n % 7 == 0 && n >= -100 && n <= 250; }
static int mul30(long n) { return n % 30 == 0; }
static int mul12_not(long n) { return n % 12 == 0 && n != 0 && n != 24 && n >= 0; }
static int mul_half(long n) { (void)n; return 1; }
static int not_ints(long n) { return n != 3 && n != 5 && n >= 0 && n <= 9; }

static void multiple_of_props(void) {
    int_prop("{\"type\":\"integer\",\"multipleOf\":7,\"minimum\":-100,\"maximum\":250}", -300, 400, mul7_in, 1);
    int_prop("{\"type\":\"integer\",\"multipleOf\":30}", -1000, 1000, mul30, 1);
    int_prop("{\"type\":\"integer\",\"multipleOf\":12,\"minimum\":0,\"not\":{\"enum\":[0,24]}}", -50, 300, mul12_not, 1);
    /* every integer is a multiple of 0.5 */
    int_prop("{\"type\":\"integer\",\"multipleOf\":0.5,\"minimum\":-20,\"maximum\":20}", -20, 20, mul_half, 1);
    int_prop("{\"type\":\"integer\",\"minimum\":0,\"maximum\":9,\"not\":{\"enum\":[3,5]}}", -5, 15, not_ints, 1);
    /* large values: 16 digits, random */
    loom_grammar *g = schema("{\"type\":\"integer\",\"multipleOf\":13}");
    for (int i = 0; g && i < 400; i++) {
        long long v = ((long long)prnd() << 22 | prnd()) % 999999999999999LL;
        if (i & 1) v = -v;
        char b[32];
        snprintf(b, sizeof b, "%lld", v);
        CHECKF(loom_grammar_accepts(g, b, strlen(b)) == (v % 13 == 0), "multipleOf 13: %s", b);
        v -= v % 13;
        snprintf(b, sizeof b, "%lld", v);
        CHECKF(loom_grammar_accepts(g, b, strlen(b)), "multipleOf 13: %s rejected", b);
    }
    if (g) loom_grammar_release(g);
    /* decimals: 10^-j is at most j digits after the point */
    lang(schema("{\"type\":\"number\",\"multipleOf\":0.01}"), "multipleOf 0.01", L("3", "-3.5", "0.07", "12.25"),
         L("0.001", "1e2", "1.255"));
    lang(schema("{\"type\":\"number\",\"multipleOf\":0.1,\"minimum\":0,\"maximum\":2}"), "multipleOf 0.1 bounded",
         L("0", "1.9", "2", "2.0"), L("2.1", "0.05", "-0.1"));
    /* another decimal: integral multiples of 2.5 (a subset) */
    lang(schema("{\"type\":\"number\",\"multipleOf\":2.5}"), "multipleOf 2.5", L("5", "-10", "0"), L("2.5", "3", "7"));
    lang(schema("{\"type\":\"number\",\"multipleOf\":4}"), "number multipleOf 4", L("8", "-4"), L("6", "8.0"));
}

/* Strings over a small alphabet: accepted iff not excluded and in
 * length. */
static void not_strings_props(void) {
    const char *sch = "{\"type\":\"string\",\"maxLength\":4,\"not\":{\"enum\":[\"ab\",\"a\",\"abc\",\"\",\"b\\\"\"]}}";
    const char *ex[] = {"ab", "a", "abc", "", "b\""};
    loom_grammar *g = schema(sch);
    const char alpha[] = "ab\"c";
    for (int i = 0; g && i < 3000; i++) {
        char raw[8], js[24];
        int n = (int)(prnd() % 6), w = 0;
        for (int k = 0; k < n; k++) raw[k] = alpha[prnd() % 4];
        raw[n] = 0;
        js[w++] = '"';
        for (int k = 0; k < n; k++) {
            if (raw[k] == '"') js[w++] = '\\';
            js[w++] = raw[k];
        }
        js[w++] = '"', js[w] = 0;
        int want = n <= 4;
        for (size_t k = 0; k < sizeof ex / sizeof *ex; k++) want &= strcmp(raw, ex[k]) != 0;
        CHECKF(loom_grammar_accepts(g, js, (size_t)w) == want, "%s: %s", sch, js);
    }
    if (g) loom_grammar_release(g);
    /* no other spelling of an excluded value */
    lang(schema("{\"type\":\"string\",\"not\":{\"const\":\"a/\"}}"), "not const, escapes",
         L("\"a\"", "\"a/b\"", "\"\\n\"", "\"\xc3\xa9\""), L("\"a/\"", "\"a\\/\"", "\"\\u0061/\""));
    lang(schema("{\"not\":{\"type\":\"null\"},\"enum\":[null,1,\"x\"]}"), "not type on enum", L("1", "\"x\""), L("null"));
    lang(schema("{\"type\":[\"boolean\",\"null\"],\"not\":{\"const\":true}}"), "not true", L("false", "null"), L("true"));
    lang(schema("{\"not\":{\"type\":[\"string\",\"object\",\"array\",\"null\",\"boolean\"]}}"), "only numbers",
         L("1", "-2.5"), L("\"x\"", "{}", "[]", "null", "true"));
    lang(schema("{\"type\":\"number\",\"not\":{\"type\":\"integer\"}}"), "not integer", L("1.5", "-0.25"),
         L("1", "1.0", "2.50", "0"));
}

/* Objects over keys a, b, c with values 0..2: accepted iff ok. */
static void obj_prop(const char *sch, int (*ok)(int a, int b, int c), int exact) {
    loom_grammar *g = schema(sch);
    int acc = 0;
    for (int m = 0; g && m < 64; m++) { /* each key absent (3) or 0..2 */
        int v[3] = {m % 4, m / 4 % 4, m / 16 % 4};
        char js[64];
        int w = snprintf(js, sizeof js, "{");
        for (int k = 0; k < 3; k++)
            if (v[k] < 3) w += snprintf(js + w, sizeof js - (size_t)w, "%s\"%c\": %d", w > 1 ? ", " : "", 'a' + k, v[k]);
        snprintf(js + w, sizeof js - (size_t)w, "}");
        int a = loom_grammar_accepts(g, js, strlen(js)), want = ok(v[0] < 3 ? v[0] : -1, v[1] < 3 ? v[1] : -1, v[2] < 3 ? v[2] : -1);
        acc += a;
        if (exact) CHECKF(a == want, "%s: %s %s", sch, js, a ? "accepted" : "rejected");
        else CHECKF(!a || want, "%s: %s accepted", sch, js);
    }
    CHECKF(!g || acc > 0, "%s accepts nothing", sch);
    if (g) loom_grammar_release(g);
}

#define ABC "\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"},\"c\":{\"type\":\"integer\"}}"
static int if_a0(int a, int b, int c) { (void)c; return a == 0 ? b >= 0 : b < 0; }
static int no_b(int a, int b, int c) { (void)a, (void)c; return b < 0; }
static int not_ab(int a, int b, int c) { (void)c; return a < 0 || b < 0; }
static int one_of(int a, int b, int c) { (void)c; return (a >= 0) + (b >= 0) == 1; }
static int one_of_disc(int a, int b, int c) { return (a == 1 && b >= 0) || (a == 2 && c >= 0); }
static int not_a1(int a, int b, int c) { (void)b, (void)c; return a != 1; }
static int a_req_not1(int a, int b, int c) { (void)b, (void)c; return a >= 0 && a != 1; }

static void logic_props(void) {
    /* if a is 0 then b is required, else b is absent */
    obj_prop("{\"type\":\"object\"," ABC ",\"additionalProperties\":false,\"if\":{\"properties\":{\"a\":{\"const\":0}},"
             "\"required\":[\"a\"]},\"then\":{\"required\":[\"b\"]},\"else\":{\"not\":{\"required\":[\"b\"]}}}",
             if_a0, 1);
    obj_prop("{\"type\":\"object\"," ABC ",\"additionalProperties\":false,\"not\":{\"required\":[\"b\"]}}", no_b, 1);
    obj_prop("{\"type\":\"object\"," ABC ",\"additionalProperties\":false,\"not\":{\"required\":[\"a\",\"b\"]}}", not_ab, 1);
    obj_prop("{\"type\":\"object\"," ABC ",\"additionalProperties\":false,\"not\":{\"properties\":{\"a\":{\"const\":1}}}}",
             a_req_not1, 1);
    obj_prop("{\"type\":\"object\"," ABC ",\"additionalProperties\":false,\"not\":{\"properties\":{\"a\":{\"const\":1}},"
             "\"required\":[\"a\"]}}", not_a1, 1);
    /* overlapping oneOf branches made exact by leaving out the other branch */
    obj_prop("{\"type\":\"object\"," ABC ",\"additionalProperties\":false,\"oneOf\":[{\"required\":[\"a\"]},"
             "{\"required\":[\"b\"]}]}", one_of, 1);
    /* a discriminator: disjoint as they are */
    obj_prop("{\"type\":\"object\"," ABC ",\"additionalProperties\":false,\"oneOf\":["
             "{\"properties\":{\"a\":{\"const\":1}},\"required\":[\"a\",\"b\"]},"
             "{\"properties\":{\"a\":{\"const\":2}},\"required\":[\"a\",\"c\"]}]}", one_of_disc, 1);
    /* extra keys under not required: any key but the one left out */
    lang(schema("{\"type\":\"object\",\"not\":{\"required\":[\"x\"]}}"), "any object without x",
         L("{}", "{\"y\": 1}", "{\"xx\": 1, \"\": 2}"), L("{\"x\": 1}", "{\"y\": 1, \"x\": 2}"));
    lang(schema("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"},{\"type\":\"number\"}]}"), "oneOf by type",
         L("\"s\"", "1.5"), L("1", "true"));
    lang(schema("{\"if\":{\"type\":\"string\"},\"then\":{\"maxLength\":2},\"else\":{\"type\":\"integer\"}}"), "if type",
         L("\"ab\"", "3"), L("\"abc\"", "1.5", "null"));
    lang(schema("{\"type\":\"integer\",\"anyOf\":[{\"minimum\":10},{\"maximum\":-10}],\"minimum\":0}"), "siblings intersect",
         L("10", "99"), L("5", "-20", "0"));
    /* allOf intersects its parts, whatever their types; additionalProperties
       false in a part leaves out the other parts' keys */
    lang(schema("{\"type\":\"string\",\"allOf\":[{\"minLength\":2},{\"maxLength\":3},{\"pattern\":\"[a-z]+\"}]}"),
         "allOf of strings", L("\"ab\"", "\"abc\""), L("\"a\"", "\"abcd\"", "\"AB\""));
    lang(schema("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}}},{\"properties\":{\"b\":{\"type\":\"integer\"}},"
                "\"additionalProperties\":false}],\"type\":\"object\"}"),
         "allOf additionalProperties", L("{}", "{\"b\": 1}"), L("{\"a\": 1}"));
    lang(schema("{\"allOf\":[{\"type\":\"integer\",\"minimum\":0},{\"multipleOf\":5},{\"maximum\":20}]}"), "allOf of numbers",
         L("0", "5", "20"), L("-5", "3", "25"));
    /* strict refuses what is only approximated; without it oneOf is anyOf */
    const char *overlap = "{\"oneOf\":[{\"type\":\"string\",\"pattern\":\"a.*\"},{\"type\":\"string\",\"pattern\":\".*b\"}]}";
    char err[256] = "";
    char *t = loom_grammar_schema_to_gbnf_ex(overlap, LOOM_SCHEMA_STRICT, err, sizeof err);
    CHECKF(!t && strstr(err, "'oneOf' branches 0 and 1 may both match one value") && strstr(err, "(at #/oneOf)"), "%s", err);
    free(t);
    lang(schema(overlap), "oneOf approximated", L("\"ab\"", "\"a\"", "\"b\""), L("\"c\""));
}

/* pattern with minLength/maxLength: random strings over an alphabet that
 * meets each pattern, accepted iff PCRE2 matches the whole string and its
 * length in code points is in bounds. */
static void pattern_length_props(void) {
    static const struct {
        const char *re;
        int mn, mx;
        const char *good, *bad; /* JSON strings: one in the language, one out by its length */
    } cases[] = {
        {"^[a-c]+x?$", 2, 4, "\"abcx\"", "\"abcbx\""},
        {"[a-c0-9._-]+@[a-c]+\\\\.(com|org)", 0, 12, "\"a.b@cc.org\"", "\"a.b-12@cc.org\""},
        {"(ab|c)*", 3, 7, "\"abcab\"", "\"abcababc\""},
        {"\\\\d{2,}-[^x]*", 5, -1, "\"12-\\\"\\n\"", "\"12-a\""},
        {"\\u00e9+.?", 0, 3, "\"\xc3\xa9\xc3\xa9\xc3\xa9\"", "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\""},
        {".*\\\"", 2, 3, "\"a\\\"\"", "\"\\\"\""},
    };
    const char *alpha[] = {"a", "b", "c", "x", "1", "2", "-", ".", "@", "o", "m", "r", "g", "\xc3\xa9", "\"", "\n"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char sch[256];
        snprintf(sch, sizeof sch, "{\"type\":\"string\",\"pattern\":\"%s\",\"minLength\":%d%s", cases[i].re, cases[i].mn,
                 cases[i].mx >= 0 ? ",\"maxLength\":" : "}");
        if (cases[i].mx >= 0) snprintf(sch + strlen(sch), sizeof sch - strlen(sch), "%d}", cases[i].mx);
        loom_grammar *g = schema(sch);
        cJSON *doc = cJSON_Parse(sch);
        const char *re = cJSON_GetObjectItem(doc, "pattern")->valuestring;
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED,
                                         &ec, &eo, NULL);
        pcre2_match_data *md = code ? pcre2_match_data_create_from_pattern(code, NULL) : NULL;
        CHECKF(code && md, "pcre2 %s", re);
        int acc = 0;
        for (int k = 0; g && md && k < 4000; k++) {
            char raw[64] = "", js[160] = "\"";
            int n = (int)(prnd() % 10);
            for (int j = 0; j < n; j++) strcat(raw, k % 3 ? alpha[prnd() % 4 + (k % 5 == 1 ? 4 : 0)] : alpha[prnd() % 16]);
            size_t w = 1;
            for (const char *q = raw; *q; q++) {
                if (*q == '"' || *q == '\\') js[w++] = '\\', js[w++] = *q;
                else if (*q == '\n') js[w++] = '\\', js[w++] = 'n';
                else js[w++] = *q;
            }
            js[w++] = '"', js[w] = 0;
            int len = 0;
            for (const char *q = raw; *q; q++) len += ((unsigned char)*q & 0xC0) != 0x80;
            int want = pcre2_match(code, (PCRE2_SPTR)raw, strlen(raw), 0, 0, md, NULL) >= 0 && len >= cases[i].mn &&
                       (cases[i].mx < 0 || len <= cases[i].mx);
            int got = loom_grammar_accepts(g, js, w);
            acc += got;
            CHECKF(got == want, "%s: %s %s", sch, js, got ? "accepted" : "rejected");
        }
        CHECKF(acc > 0 || (cases[i].good && i == 1), "%s: no random string accepted", sch);
        CHECKF(!g || loom_grammar_accepts(g, cases[i].good, strlen(cases[i].good)), "%s: %s rejected", sch, cases[i].good);
        CHECKF(!g || !loom_grammar_accepts(g, cases[i].bad, strlen(cases[i].bad)), "%s: %s accepted", sch, cases[i].bad);
        pcre2_match_data_free(md);
        pcre2_code_free(code);
        cJSON_Delete(doc);
        if (g) loom_grammar_release(g);
    }
}

/* One pattern with a length on many properties is written once: the
 * grammar of twelve such properties is not twelve times that of one (the
 * product with the counter is the bulk of it), and every property still
 * holds its language; so does a use after a branch that used the pattern
 * was dropped (nothing validates in it). */
static void pattern_length_shared(void) {
    const char *prop = "{\"type\":\"string\",\"pattern\":\"^(?:\\\\S+\\\\s+){0,9}\\\\S+$\",\"maxLength\":60}";
    char one[512], many[4096], err[256];
    snprintf(one, sizeof one, "{\"type\":\"object\",\"properties\":{\"p0\":%s}}", prop);
    int w = snprintf(many, sizeof many, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 12; i++) w += snprintf(many + w, sizeof many - (size_t)w, "%s\"p%d\":%s", i ? "," : "", i, prop);
    snprintf(many + w, sizeof many - (size_t)w, "}}");
    char *g1 = loom_grammar_schema_to_gbnf(one, err, sizeof err), *g12 = loom_grammar_schema_to_gbnf(many, err, sizeof err);
    CHECKF(g1 && g12, "%s", err);
    if (g1 && g12) CHECKF(strlen(g12) < 2 * strlen(g1), "12 properties: %zu bytes of grammar, one: %zu", strlen(g12), strlen(g1));
    free(g1), free(g12);
    lang(schema(many), "shared pattern", L("{\"p0\":\"a b\",\"p11\":\"c\"}", "{\"p5\":\"one two three\"}"),
         L("{\"p11\":\"a  \"}", "{\"p3\":\"a b c d e f g h i j k\"}",
           "{\"p7\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}"));
    snprintf(many, sizeof many,
             "{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"x\":%s,"
             "\"y\":{\"type\":\"string\",\"enum\":[1]}},\"required\":[\"x\",\"y\"]},{\"type\":\"null\"}]},\"b\":%s}}",
             prop, prop);
    lang(schema(many), "pattern after a dropped branch", L("{\"a\":null,\"b\":\"x y\"}"), L("{\"a\":\"x\"}", "{\"b\":\" \"}"));
}

/* Forced tool calls: the syntax around the call, the name, the arguments
 * under the tool's schema. */
static void tools(void) {
    const char *tj = "[{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\","
                     "\"properties\":{\"tz\":{\"enum\":[\"UTC\",\"CET\"]}},\"required\":[\"tz\"]}}},"
                     "{\"type\":\"function\",\"function\":{\"name\":\"ping\"}},"
                     "{\"type\":\"function\",\"function\":{\"name\":\"tree\",\"parameters\":{\"$defs\":{\"n\":"
                     "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}}}},"
                     "\"$ref\":\"#/$defs/n\"}}}]";
    loom_gtool_syntax hermes = {"", "", "<tool_call>\n", "\n</tool_call>", "\n", "arguments", 1};
    loom_gtool_syntax llama = {"", "", "", "", NULL, "parameters", 1};
    loom_gtool_syntax mistral = {"[TOOL_CALLS][", "]", "", "", ", ", "arguments", 2};
    char err[256];
    loom_grammar *g;
    CHECKF(loom_grammar_from_tools(tj, NULL, &hermes, NULL, &g, err, sizeof err) == LOOM_OK, "%s", err);
    lang(g, "tools required",
         L("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>",
           "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>",
           "<tool_call>\n{\"name\": \"tree\", \"arguments\": {\"k\": [{\"k\": []}]}}\n</tool_call>"),
         L("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"PST\"}}\n</tool_call>",
           "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>",
           "{\"name\": \"ping\", \"arguments\": {}}", "hello",
           "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"ping\", "
           "\"arguments\": {}}\n</tool_call>"));
    CHECKF(loom_grammar_from_tools(tj, "get_time", &llama, NULL, &g, err, sizeof err) == LOOM_OK, "%s", err);
    lang(g, "tools named", L("{\"name\": \"get_time\", \"parameters\": {\"tz\":\"UTC\"}}"),
         L("{\"name\": \"ping\", \"parameters\": {}}", "{\"name\": \"get_time\", \"arguments\": {\"tz\":\"UTC\"}}"));
    CHECKF(loom_grammar_from_tools(tj, NULL, &mistral, NULL, &g, err, sizeof err) == LOOM_OK, "%s", err);
    lang(g, "tools list",
         L("[TOOL_CALLS][{\"name\": \"ping\", \"arguments\": {}}]",
           "[TOOL_CALLS][{\"name\": \"ping\", \"arguments\": {}}, {\"name\": \"get_time\", \"arguments\": {\"tz\":\"UTC\"}}]"),
         L("[TOOL_CALLS][]", "[{\"name\": \"ping\", \"arguments\": {}}]"));
    g = NULL;
    CHECK(loom_grammar_from_tools(tj, "absent", &hermes, NULL, &g, err, sizeof err) != LOOM_OK && !g);
    CHECKF(strstr(err, "no tool named 'absent'") != NULL, "%s", err);
    const char *bad = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                      "\"properties\":{\"a\":{\"if\":{\"pattern\":\"x\"}}}}}}]";
    CHECK(loom_grammar_from_tools(bad, NULL, &hermes, NULL, &g, err, sizeof err) != LOOM_OK && !g);
    CHECKF(strstr(err, "tool 'f' parameters: 'if' is supported when loom can write its negation") &&
           strstr(err, "(at #/properties/a/if)"), "%s", err);
}

/* ---- masks against brute force ---------------------------------------------- */

static uint64_t rng = 88172645463325252ULL;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* The reference: token t is allowed iff the prefix plus its bytes is still
 * a prefix of some sentence; checked by running a fresh matcher over the
 * whole text byte by byte. */
static int ref_allowed(loom_grammar *g, const char *prefix, size_t n, const char *tok, int len) {
    if (len <= 0) return 0;
    loom_gmatcher m;
    loom_gmatcher_init(&m, g);
    if (loom_gmatcher_accept_bytes(&m, prefix, n)) return 0;
    for (int i = 0; i < len; i++)
        if (loom_gmatcher_accept_bytes(&m, tok + i, 1)) return 0;
    return 1;
}

/* Walks random allowed tokens from the start; at each state compares the
 * mask with the reference for every token. */
static void mask_vs_ref(loom_grammar *g, const char *const *bytes, const int *lens, int V, int steps, int walks) {
    uint32_t *bits = calloc((size_t)(V + 31) / 32, 4);
    char text[4096];
    int bad = 0;
    for (int w = 0; w < walks; w++) {
        loom_gmatcher m;
        loom_gmatcher_init(&m, g);
        size_t n = 0;
        for (int s = 0; s < steps; s++) {
            int count = loom_gmatcher_mask(&m, bits), ref_count = 0;
            for (int t = 0; t < V; t++) {
                int want = ref_allowed(g, text, n, bytes[t], lens[t]);
                int got = bits[t >> 5] >> (t & 31) & 1;
                ref_count += want;
                if (want != got && bad++ < 5)
                    fprintf(stderr, "token %d (%.*s) after '%.*s': mask %d, reference %d\n", t, lens[t] > 0 ? lens[t] : 0,
                            bytes[t], (int)n, text, got, want);
            }
            CHECK_EQ_INT(count, ref_count);
            if (!ref_count) break;
            int pick = (int)(rnd() % (uint32_t)ref_count), t = 0;
            for (;; t++)
                if ((bits[t >> 5] >> (t & 31) & 1) && !pick--) break;
            CHECK(loom_gmatcher_accept_token(&m, t) == 0);
            if (n + (size_t)lens[t] >= sizeof text) break;
            memcpy(text + n, bytes[t], (size_t)lens[t]);
            n += (size_t)lens[t];
        }
    }
    CHECK_EQ_INT(bad, 0);
    free(bits);
}

static void masks_small(void) {
    /* a vocabulary with multi-byte tokens spanning grammar boundaries and
     * pieces of UTF-8 characters */
    static const char *const toks[] = {"{", "}", "\"", "\":", "\",", "\"}", "a", "ab", "name", "\"name\"", " ", "\n",
                                       "  ", ":", ",", "1", "12", "-", "0", ".5", "true", "tr", "ue", "null", "[",
                                       "]", "[]", "{}", "\xc3", "\xa9", "\xc3\xa9", "\xe2\x82", "\xac", "\\", "\\n",
                                       "\\u", "00e9", "e", "E", "+", "x", "\"age", "age\":", "}}", "\"\"",
                                       /* text tokens past the bitsets' 24 code points, and text
                                          then something else */
                                       "abcdefghijklmnopqrstuvwxyz0123", "ab\xc3\xa9" "cdefghijklmnopqrstuvwxyz\",",
                                       "x\",", "ab\"}", "\xc3\xa9!", "e\xe2\x82", NULL};
    int V = 0;
    int lens[64];
    while (toks[V]) lens[V] = (int)strlen(toks[V]), V++;
    lens[V] = -1; /* a special token: no bytes */
    const char *bytes[64];
    memcpy(bytes, toks, sizeof *bytes * (size_t)V);
    bytes[V] = "";
    V++;
    loom_gvocab *v;
    CHECK(loom_gvocab_create(bytes, lens, V, &v) == LOOM_OK);
    const char *schemas_[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":4},\"age\":{\"type\":\"integer\"}},\"required\":[\"name\"]}",
        "{\"type\":\"object\"}",
        "{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"ab\",true,null]},\"maxItems\":4}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":40}}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"[a-z\\u00e9]{0,30}\"}}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\"}}",
    };
    for (int i = 0; i < 6; i++) {
        loom_grammar *g;
        char err[256];
        CHECKF(loom_grammar_from_schema(schemas_[i], v, &g, err, sizeof err) == LOOM_OK, "%s", err);
        mask_vs_ref(g, bytes, lens, V, 24, 20);
        loom_grammar_release(g);
    }
    loom_grammar *g;
    char err[256];
    CHECK(loom_grammar_from_gbnf("root ::= \"\xc3\xa9\"+ | [a-b]+ \"\\n\"", v, &g, err, sizeof err) == LOOM_OK);
    mask_vs_ref(g, bytes, lens, V, 10, 10);
    loom_grammar_release(g);
    /* mask_logits: -inf exactly where the mask refuses, whole words (32
     * refused tokens) and the last, partial word included */
    CHECK(loom_grammar_from_schema(schemas_[0], v, &g, err, sizeof err) == LOOM_OK);
    loom_gmatcher m;
    loom_gmatcher_init(&m, g);
    for (int step = 0; step < 12; step++) {
        uint32_t bits[4], ref[4];
        float logits[64];
        for (int k = 0; k < V; k++) logits[k] = (float)k;
        logits[V] = 7; /* past n: untouched */
        loom_gmatcher copy = m;
        int n = loom_gmatcher_mask_logits(&m, bits, logits, V), allowed = 0, first = -1;
        loom_gmatcher_mask(&copy, ref);
        for (int k = 0; k < V; k++) {
            int on = ref[k >> 5] >> (k & 31) & 1;
            allowed += on;
            if (on && first < 0) first = k;
            CHECKF(on ? logits[k] == (float)k : logits[k] == -INFINITY, "step %d token %d: logit %g, allowed %d", step,
                   k, logits[k], on);
        }
        CHECKF(n == allowed && logits[V] == 7, "step %d: %d allowed, mask_logits said %d", step, allowed, n);
        if (first < 0 || loom_gmatcher_accept_token(&m, first)) break;
    }
    loom_grammar_release(g);
    loom_gvocab_free(v);
}

/* The bundled model's vocabulary (8192 byte-level tokens). */
static void masks_model_vocab(void) {
    loom_tok *t;
    if (loom_tok_load_dir("models/pycoder-16m", &t) != LOOM_OK) {
        CHECKF(0, "models/pycoder-16m tokenizer: %s", loom_last_error());
        return;
    }
    int V = loom_tok_vocab_size(t);
    char **bytes = calloc((size_t)V, sizeof *bytes);
    int *lens = calloc((size_t)V, sizeof *lens);
    for (int i = 0; i < V; i++) {
        char buf[256];
        lens[i] = loom_tok_token_bytes(t, i, buf, sizeof buf);
        if (lens[i] > 0) bytes[i] = malloc((size_t)lens[i]), memcpy(bytes[i], buf, (size_t)lens[i]);
        else bytes[i] = calloc(1, 1);
    }
    /* the vocabulary as the engine builds it */
    loom_gvocab *v;
    CHECK(loom_gvocab_from_tok(t, V, &v) == LOOM_OK);
    int32_t id = loom_tok_token_to_id(t, "{\"", 2);
    (void)id;
    loom_grammar *g;
    char err[256];
    CHECKF(loom_grammar_from_schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
                                    "\"n\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":50},\"tags\":{\"type\":\"array\","
                                    "\"items\":{\"enum\":[\"x\",\"yy\"]},\"maxItems\":2}},\"required\":[\"name\",\"n\"]}",
                                    v, &g, err, sizeof err) == LOOM_OK, "%s", err);
    if (g) mask_vs_ref(g, (const char *const *)bytes, lens, V, 12, 3);
    loom_grammar_release(g);
    loom_gvocab_free(v);
    for (int i = 0; i < V; i++) free(bytes[i]);
    free(bytes), free(lens);
    loom_tok_free(t);
}

/* qwen3's vocabulary (151k byte-level tokens): at every step of a valid
 * document, and after short random detours from it, the mask of a fresh
 * state must be exactly the tokens whose bytes the matcher takes one by
 * one. The schemas reach the shortcuts of design notes 6 and 7: bounded
 * and unbounded strings, formats and patterns over ASCII classes, keys,
 * numbers, enums. */
typedef struct mcase {
    const char *schema, *doc;
} mcase;

static const mcase BIG_CASES[] = {
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":64},\"short\":{\"type\":\"string\","
     "\"minLength\":2,\"maxLength\":5},\"email\":{\"type\":\"string\",\"format\":\"email\"}},\"required\":[\"name\"]}",
     "{\"name\": \"Ada Lovelace, née Byron \\\"the\\\" \\u00e9 \\n ok\", \"short\": \"ab\", \"email\": \"ada.l+x@math.example.org\"}"},
    {"{\"type\":\"object\",\"properties\":{\"when\":{\"type\":\"string\",\"format\":\"date-time\"},\"id\":{\"type\":\"string\","
     "\"format\":\"uuid\"},\"host\":{\"type\":\"string\",\"format\":\"hostname\"},\"ip\":{\"type\":\"string\",\"format\":\"ipv4\"},"
     "\"site\":{\"type\":\"string\",\"format\":\"uri\"}}}",
     "{\"when\": \"2024-02-29T23:59:59.5+01:00\", \"id\": \"0fa3b2c4-1d2e-4f50-8a9b-abcdef012345\", \"host\": "
     "\"my-host.example.com\", \"ip\": \"192.168.0.255\", \"site\": \"https://example.com/a/b_c\"}"},
    {"{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^[a-z][a-z0-9_]{0,30}$\"},\"maxItems\":4}",
     "[\"snake_case_name\", \"x1\", \"abcdefghijklmnopqrstuvwxyz01234\"]"},
    {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"number\"},\"i\":{\"type\":\"integer\",\"minimum\":-20,"
     "\"maximum\":300},\"e\":{\"enum\":[\"red\",\"green\",42,null]},\"b\":{\"type\":\"boolean\"}}}",
     "{\"n\": -12.5e+3, \"i\": 299, \"e\": \"green\", \"b\": true}"},
    {"{\"type\":\"object\"}",
     "{\"id\": 42, \"items\": [{\"sku\": \"A-1\", \"qty\": 3}], \"note\": \"deliver after 5pm\\t\\u2764\", \"x\": null}"},
    {"{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":3}}", "[\"abc\", \"\", \"é€\", \"\\\"\\\\\"]"},
};

static int brute_mask(loom_gmatcher *m, int V, uint32_t *ref) {
    int n = 0;
    memset(ref, 0, sizeof *ref * (size_t)((V + 31) / 32));
    for (int t = 0; t < V; t++) {
        loom_gmatcher c = *m;
        if (!loom_gmatcher_accept_token(&c, t)) ref[t >> 5] |= 1u << (t & 31), n++;
    }
    return n;
}

/* Compares m's mask with brute force; returns the number of differences. */
static int mask_check(loom_gmatcher *m, int V, uint32_t *bits, uint32_t *ref, const char *what, int step) {
    int count = loom_gmatcher_mask(m, bits), n = brute_mask(m, V, ref), bad = 0;
    for (int w = 0; w < (V + 31) / 32; w++)
        if (bits[w] != ref[w]) {
            for (int k = 0; k < 32; k++)
                if ((bits[w] ^ ref[w]) >> k & 1 && bad++ < 3)
                    fprintf(stderr, "%s step %d: token %d: mask %d, reference %d\n", what, step, w * 32 + k,
                            bits[w] >> k & 1, ref[w] >> k & 1);
        }
    CHECKF(count == n, "%s step %d: mask count %d, reference %d", what, step, count, n);
    return bad;
}

static void masks_qwen3(void) {
    const char *b = getenv("LOOM_BUILD");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/fixtures/tokenizers/qwen3", b && *b ? b : "build");
    loom_tok *t;
    if (loom_tok_load_dir(dir, &t) != LOOM_OK) {
        CHECKF(0, "%s: %s (tests/run.sh unpacks it)", dir, loom_last_error());
        return;
    }
    int V = loom_tok_vocab_size(t);
    loom_gvocab *v;
    CHECK(loom_gvocab_from_tok(t, V, &v) == LOOM_OK);
    uint32_t *bits = calloc((size_t)(V + 31) / 32, 4), *ref = calloc((size_t)(V + 31) / 32, 4);
    int bad = 0, checked = 0;
    for (size_t c = 0; c < sizeof BIG_CASES / sizeof *BIG_CASES; c++) {
        loom_grammar *g;
        char err[256];
        CHECKF(loom_grammar_from_schema(BIG_CASES[c].schema, v, &g, err, sizeof err) == LOOM_OK, "%s", err);
        if (!g) continue;
        int32_t *ids;
        size_t n;
        CHECK(loom_tok_encode(t, BIG_CASES[c].doc, strlen(BIG_CASES[c].doc), LOOM_TOK_NO_SPECIAL, &ids, &n) == LOOM_OK);
        char what[32];
        snprintf(what, sizeof what, "case %zu", c);
        loom_gmatcher m;
        loom_gmatcher_init(&m, g);
        for (size_t i = 0; i < n; i++) {
            bad += mask_check(&m, V, bits, ref, what, (int)i), checked++;
            /* a detour: two random allowed tokens, short ones likelier */
            loom_gmatcher d = m;
            for (int k = 0; k < 2; k++) {
                int cnt = brute_mask(&d, V, ref);
                if (!cnt) break;
                int pick = -1;
                for (int tries = 0; tries < 64 && pick < 0; tries++) {
                    int x = (int)(rnd() % (uint32_t)V);
                    char buf[256];
                    if ((ref[x >> 5] >> (x & 31) & 1) && (rnd() % 4 == 0 || loom_tok_token_bytes(t, x, buf, sizeof buf) <= 2))
                        pick = x;
                }
                for (int x = 0; pick < 0; x++)
                    if (ref[x >> 5] >> (x & 31) & 1) pick = x;
                CHECK(loom_gmatcher_accept_token(&d, pick) == 0);
                bad += mask_check(&d, V, bits, ref, what, (int)i), checked++;
            }
            CHECKF(loom_gmatcher_accept_token(&m, ids[i]) == 0, "%s: the document's token %zu is refused", what, i);
        }
        CHECKF(loom_gmatcher_done(&m), "%s: the document does not end the grammar", what);
        free(ids);
        loom_grammar_release(g);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(checked > 300);
    free(bits), free(ref);
    loom_gvocab_free(v);
    loom_tok_free(t);
}

/* ---- the engine under a schema ----------------------------------------------- */

/* The bundled model writes Python; under the schema every output must be a
 * JSON document that parses and holds the schema's fields, checked here by
 * hand (not by the grammar), greedy and sampled, several at once. */
static void engine_schema(void) {
    loom_model *m;
    loom_tok *t;
    if (loom_model_load("models/pycoder-16m", NULL, &m) || loom_tok_load_dir("models/pycoder-16m", &t)) {
        CHECKF(0, "models/pycoder-16m: %s", loom_last_error());
        return;
    }
    loom_gvocab *v;
    CHECK(loom_gvocab_from_tok(t, loom_model_vocab_size(m), &v) == LOOM_OK);
    const char *sch = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,"
                      "\"maxLength\":12},\"count\":{\"type\":\"integer\",\"minimum\":3,\"maximum\":70},"
                      "\"kind\":{\"enum\":[\"a\",\"bb\"]},\"ok\":{\"type\":\"boolean\"},\"ids\":{\"type\":\"array\","
                      "\"items\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},\"minItems\":1,\"maxItems\":3}},"
                      "\"required\":[\"name\",\"count\",\"kind\",\"ids\"]}";
    loom_grammar *g;
    char err[256];
    CHECKF(loom_grammar_from_schema(sch, v, &g, err, sizeof err) == LOOM_OK, "%s", err);
    loom_engine *e;
    loom_engine_params ep = loom_engine_default_params();
    ep.n_ctx = 512;
    ep.max_seqs = 8;
    CHECK(loom_engine_create(m, &ep, &e) == LOOM_OK);
    int32_t *prompt;
    size_t n_prompt;
    CHECK(loom_tok_encode(t, "def main():\n", 12, LOOM_TOK_NO_SPECIAL, &prompt, &n_prompt) == LOOM_OK);
    enum { N = 6 };
    loom_request *rq[N];
    for (int i = 0; i < N; i++) {
        loom_request_params rp = loom_request_default_params();
        rp.prompt = prompt;
        rp.n_prompt = (int)n_prompt;
        rp.max_tokens = 400;
        rp.sampling.temperature = i ? 1.0f : 0;
        rp.sampling.seed = (uint64_t)i;
        rp.grammar = g;
        CHECK(loom_engine_submit(e, &rp, &rq[i]) == LOOM_OK);
    }
    loom_grammar_release(g); /* the requests hold theirs */
    for (int i = 0; i < N; i++) {
        int32_t ids[400];
        int n = 0;
        loom_event ev;
        while (loom_request_next(rq[i], &ev, 60000) == LOOM_OK && ev.finish == LOOM_FINISH_NONE)
            if (n < 400) ids[n++] = ev.token;
        CHECKF(ev.finish == LOOM_FINISH_STOP, "request %d finished %d", i, ev.finish);
        char *text;
        CHECK(loom_tok_decode(t, ids, (size_t)n, 1, &text, NULL) == LOOM_OK);
        cJSON *j = cJSON_Parse(text);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name"), *count = cJSON_GetObjectItemCaseSensitive(j, "count");
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "kind"), *ok = cJSON_GetObjectItemCaseSensitive(j, "ok");
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "ids");
        int valid = cJSON_IsObject(j) && cJSON_IsString(name) && strlen(name->valuestring) >= 1 && cJSON_IsNumber(count) &&
                    count->valuedouble >= 3 && count->valuedouble <= 70 && count->valuedouble == (int)count->valuedouble &&
                    cJSON_IsString(kind) && (!strcmp(kind->valuestring, "a") || !strcmp(kind->valuestring, "bb")) &&
                    (!ok || cJSON_IsBool(ok)) && cJSON_IsArray(arr) && cJSON_GetArraySize(arr) >= 1 &&
                    cJSON_GetArraySize(arr) <= 3 && cJSON_GetArraySize(j) <= 5;
        for (const cJSON *x = arr ? arr->child : NULL; x && valid; x = x->next)
            valid = cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble <= 9;
        CHECKF(valid, "request %d wrote %s", i, text);
        cJSON_Delete(j);
        free(text);
        loom_request_free(rq[i]);
    }
    free(prompt);
    loom_engine_free(e);
    loom_gvocab_free(v);
    loom_tok_free(t);
    loom_model_free(m);
}

/* `loom generate --json-schema FILE` and `--regex`: the printed output is
 * the constrained text. */
static void cli_generate(void) {
    const char *b = getenv("LOOM_BUILD");
    char path[] = "/tmp/loom-test-grammar-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    const char *sch = "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":5},"
                      "\"s\":{\"type\":\"string\",\"format\":\"date\"}},\"required\":[\"x\",\"s\"]}";
    CHECK(write(fd, sch, strlen(sch)) == (ssize_t)strlen(sch));
    close(fd);
    for (int seed = 0; seed < 4; seed++) {
        char cmd[1024], out[8192];
        snprintf(cmd, sizeof cmd, "%s/loom generate --model models/pycoder-16m --prompt 'import os' --max-tokens 300 "
                 "--temperature 1 --seed %d --json-schema %s 2>/dev/null", b && *b ? b : "build", seed, path);
        FILE *p = popen(cmd, "r");
        size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
        out[n] = 0;
        CHECKF(p && pclose(p) == 0, "%s", cmd);
        cJSON *j = cJSON_Parse(out);
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "x"), *d = cJSON_GetObjectItemCaseSensitive(j, "s");
        int y, mo, da;
        CHECKF(cJSON_IsNumber(x) && x->valuedouble >= -5 && x->valuedouble <= 5 && cJSON_IsString(d) &&
                   sscanf(d->valuestring, "%4d-%2d-%2d", &y, &mo, &da) == 3 && mo >= 1 && mo <= 12 && da >= 1 &&
                   da <= 31 && cJSON_GetArraySize(j) == 2,
               "seed %d wrote %s", seed, out);
        cJSON_Delete(j);
    }
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "%s/loom generate --model models/pycoder-16m --prompt 'x' --max-tokens 30 "
             "--regex '(yes|no), [0-9]{2}!' 2>&1", b && *b ? b : "build");
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    CHECK(p && pclose(p) == 0);
    CHECKF((!strncmp(out, "yes, ", 5) || !strncmp(out, "no, ", 4)) && strstr(out, "!\n"), "%s", out);
    FILE *f = fopen(path, "w");
    fputs("{\"type\":\"object\",\"not\":{\"minProperties\":1}}", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s/loom generate --model models/pycoder-16m --prompt 'x' --json-schema %s 2>&1",
             b && *b ? b : "build", path);
    p = popen(cmd, "r");
    n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    int st = p ? pclose(p) : -1;
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 2 && strstr(out, "'not' over 'minProperties' is not supported") &&
           strstr(out, "(at #/not/minProperties)"), "%s", out);
    unlink(path);
}

int main(void) {
    gbnf_errors();
    gbnf_lang();
    regexes();
    repeat_counts();
    schemas();
    multiple_of_props();
    not_strings_props();
    logic_props();
    pattern_length_props();
    pattern_length_shared();
    tools();
    masks_small();
    masks_model_vocab();
    masks_qwen3();
    engine_schema();
    cli_generate();
    return test_report("test_grammar");
}
