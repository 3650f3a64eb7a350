/* safetensors reader: round trips through real files, the dtype conversions, and one test per
 * kind of malformed file, each of which must fail with a status and a message naming the problem.
 * Files are built here in memory, byte by byte, so every case documents its own layout. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

/* ---- building files ----------------------------------------------------------------------- */

/* u64 little-endian `length_field`, then `header_len` header bytes, then the data. The length
 * field is separate so tests can lie about it. Caller frees. */
static uint8_t *make_raw(uint64_t length_field, const char *header, size_t header_len,
                         const void *data, size_t data_len, size_t *size) {
    *size = 8 + header_len + data_len;
    uint8_t *buf = malloc(*size);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(length_field >> (8 * i));
    if (header_len) memcpy(buf + 8, header, header_len);
    if (data_len) memcpy(buf + 8 + header_len, data, data_len);
    return buf;
}

/* A well-formed layout around `header`, padded with spaces to a multiple of 8 like the
 * reference writer does. */
static uint8_t *make_file(const char *header, const void *data, size_t data_len, size_t *size) {
    char padded[4096];
    size_t n = strlen(header);
    assert_true(n + 8 < sizeof padded);
    memcpy(padded, header, n);
    while (n % 8) padded[n++] = ' ';
    return make_raw(n, padded, n, data, data_len, size);
}

/* Parses header + data from memory as "t.safetensors" and closes the result. */
static nopad_status parse_header(const char *header, const void *data, size_t data_len) {
    size_t size;
    uint8_t *buf = make_file(header, data, data_len, &size);
    safetensors_file f;
    nopad_status st = safetensors_parse(buf, size, "t.safetensors", &f);
    safetensors_close(&f);
    free(buf);
    return st;
}

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_f32(uint8_t *p, float v) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(bits >> (8 * i));
}

static void write_in(const char *dir, const char *name, const void *data, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (len) assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

/* A safetensors file `name` in `dir`. */
static void write_st_in(const char *dir, const char *name, const char *header, const void *data,
                        size_t data_len) {
    size_t size;
    uint8_t *buf = make_file(header, data, data_len, &size);
    write_in(dir, name, buf, size);
    free(buf);
}

/* ---- valid files -------------------------------------------------------------------------- */

static const uint16_t f16_bits[12] = {0x3c00, 0xc000, 0x0001, 0x03ff, 0x0400, 0x7bff,
                                      0x7c00, 0xfc00, 0x7e00, 0x8000, 0x3555, 0x8001};
static const uint16_t bf16_bits[6] = {0x3f80, 0xc040, 0x7f80, 0x0001, 0xff80, 0x7fc0};
static const float f32_values[6] = {1.5f, -2.25f, 0.0f, 3.0e-39f /* subnormal */, 1e30f, -7.0f};

/* b.u8 [3] at 0, then c.f32 at byte 3 (unaligned on purpose), a.f16, d.bf16. The header lists
 * them in neither name nor offset order. */
static uint8_t *make_mixed_file(size_t *size) {
    static const char header[] =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"c.f32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[3,27]},"
        "\"d.bf16\":{\"dtype\":\"BF16\",\"shape\":[6],\"data_offsets\":[51,63]},"
        "\"b.u8\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
        "\"a.f16\":{\"shape\":[3,4],\"dtype\":\"F16\",\"data_offsets\":[27,51]}}";
    uint8_t data[63];
    data[0] = 7, data[1] = 8, data[2] = 9;
    for (int i = 0; i < 6; i++) put_f32(data + 3 + 4 * i, f32_values[i]);
    for (int i = 0; i < 12; i++) put_u16(data + 27 + 2 * i, f16_bits[i]);
    for (int i = 0; i < 6; i++) put_u16(data + 51 + 2 * i, bf16_bits[i]);
    return make_file(header, data, sizeof data, size);
}

static void test_round_trip(void **state) {
    (void)state;
    size_t size;
    uint8_t *buf = make_mixed_file(&size);
    const char *path = test_write_temp(0, ".safetensors", buf, size);
    free(buf);

    safetensors_file f;
    assert_nopad_ok(safetensors_open(path, &f));
    assert_non_null(f.map);
    assert_int_equal(f.map_size, size);
    assert_string_equal(f.path, path);
    assert_int_equal(f.n_tensors, 4);
    /* sorted by name, whatever the header's order */
    assert_string_equal(f.tensors[0].name, "a.f16");
    assert_string_equal(f.tensors[1].name, "b.u8");
    assert_string_equal(f.tensors[2].name, "c.f32");
    assert_string_equal(f.tensors[3].name, "d.bf16");
    assert_null(safetensors_find(&f, "missing"));
    assert_null(safetensors_find(&f, ""));

    const safetensors_tensor *u8 = safetensors_find(&f, "b.u8");
    assert_non_null(u8);
    assert_int_equal(u8->dtype, ST_U8);
    assert_int_equal(u8->nbytes, 3);
    assert_int_equal(((const uint8_t *)u8->data)[2], 9);
    float scratch[3];
    assert_nopad_error(safetensors_to_f32(u8, scratch), NOPAD_ERR_UNSUPPORTED, "'b.u8'");
    assert_nopad_error(safetensors_to_f32(u8, scratch), NOPAD_ERR_UNSUPPORTED, "U8");

    const safetensors_tensor *c = safetensors_find(&f, "c.f32");
    assert_non_null(c);
    assert_int_equal(c->dtype, ST_F32);
    assert_int_equal(c->ndim, 2);
    assert_int_equal(c->shape[0], 2);
    assert_int_equal(c->shape[1], 3);
    assert_int_equal(c->n_elements, 6);
    assert_int_equal(c->nbytes, 24);
    assert_ptr_equal(c->data, (const uint8_t *)f.map + size - 63 + 3);
    float f32[6];
    assert_nopad_ok(safetensors_to_f32(c, f32));
    assert_memory_equal(f32, f32_values, sizeof f32);

    const safetensors_tensor *a = safetensors_find(&f, "a.f16");
    assert_non_null(a);
    assert_int_equal(a->dtype, ST_F16);
    assert_int_equal(a->n_elements, 12);
    float h[12];
    assert_nopad_ok(safetensors_to_f32(a, h));
    assert_true(h[0] == 1.0f);
    assert_true(h[1] == -2.0f);
    assert_true(h[2] == 0x1p-24f);            /* smallest subnormal */
    assert_true(h[3] == 1023 * 0x1p-24f);     /* largest subnormal */
    assert_true(h[4] == 0x1p-14f);            /* smallest normal */
    assert_true(h[5] == 65504.0f);            /* largest finite */
    assert_true(isinf(h[6]) && h[6] > 0);
    assert_true(isinf(h[7]) && h[7] < 0);
    assert_true(isnan(h[8]));
    assert_true(h[9] == 0.0f && signbit(h[9])); /* -0 */
    assert_true(h[10] == 0.333251953125f);
    assert_true(h[11] == -0x1p-24f);

    const safetensors_tensor *d = safetensors_find(&f, "d.bf16");
    assert_non_null(d);
    float b[6];
    assert_nopad_ok(safetensors_to_f32(d, b));
    assert_true(b[0] == 1.0f);
    assert_true(b[1] == -3.0f);
    assert_true(isinf(b[2]) && b[2] > 0);
    assert_true(b[3] == 0x1p-133f); /* bf16 subnormal */
    assert_true(isinf(b[4]) && b[4] < 0);
    assert_true(isnan(b[5]));

    safetensors_close(&f);
    assert_null(f.tensors);
    safetensors_close(&f); /* twice is harmless */
}

static void test_dtype_table(void **state) {
    (void)state;
    assert_string_equal(safetensors_dtype_name(ST_BF16), "BF16");
    assert_string_equal(safetensors_dtype_name(ST_F8_E5M2), "F8_E5M2");
    assert_int_equal(safetensors_dtype_size(ST_F64), 8);
    assert_int_equal(safetensors_dtype_size(ST_F8_E4M3), 1);
    assert_int_equal(safetensors_dtype_size(ST_I16), 2);
    assert_string_equal(safetensors_dtype_name((safetensors_dtype)99), "UNKNOWN");
    assert_int_equal(safetensors_dtype_size((safetensors_dtype)99), 0);

    /* every dtype name is accepted in a header, with its size */
    static const char *names[] = {"BOOL", "U8",  "I8",  "I16", "U16", "F16",     "BF16",   "I32",
                                  "U32",  "F32", "F64", "I64", "U64", "F8_E4M3", "F8_E5M2"};
    for (int i = 0; i < 15; i++) {
        char header[256];
        size_t sz = safetensors_dtype_size((safetensors_dtype)i);
        snprintf(header, sizeof header,
                 "{\"x\":{\"dtype\":\"%s\",\"shape\":[2],\"data_offsets\":[0,%zu]}}", names[i],
                 2 * sz);
        uint8_t data[16] = {0};
        size_t size;
        uint8_t *buf = make_file(header, data, 2 * sz, &size);
        safetensors_file f;
        assert_nopad_ok(safetensors_parse(buf, size, "t.safetensors", &f));
        assert_int_equal(f.tensors[0].dtype, i);
        assert_string_equal(safetensors_dtype_name(f.tensors[0].dtype), names[i]);
        safetensors_close(&f);
        free(buf);
    }
}

static void test_scalar_and_empty(void **state) {
    (void)state;
    const char *header =
        "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
        "\"z\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]},"
        "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
        "\"e2\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[4,4]},"
        "\"tail\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[6,6]}}";
    uint8_t data[6];
    put_f32(data, 42.5f);
    data[4] = 1, data[5] = 2;
    size_t size;
    uint8_t *buf = make_file(header, data, sizeof data, &size);
    safetensors_file f;
    assert_nopad_ok(safetensors_parse(buf, size, "t.safetensors", &f));
    assert_null(f.map); /* in-memory parse */
    assert_int_equal(f.n_tensors, 5);

    const safetensors_tensor *s = safetensors_find(&f, "s");
    assert_non_null(s);
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->n_elements, 1);
    assert_int_equal(s->nbytes, 4);
    float v = 0;
    assert_nopad_ok(safetensors_to_f32(s, &v));
    assert_true(v == 42.5f);

    const safetensors_tensor *e = safetensors_find(&f, "e");
    assert_non_null(e);
    assert_int_equal(e->ndim, 2);
    assert_int_equal(e->shape[1], 5);
    assert_int_equal(e->n_elements, 0);
    assert_int_equal(e->nbytes, 0);
    assert_nopad_ok(safetensors_to_f32(e, NULL)); /* nothing to write */
    assert_non_null(safetensors_find(&f, "e2"));
    assert_int_equal(safetensors_find(&f, "tail")->n_elements, 0);
    safetensors_close(&f);
    free(buf);
}

static void test_padding_and_names(void **state) {
    (void)state;
    /* the reference writer's empty file: "{}" + 6 spaces, no data */
    assert_nopad_ok(parse_header("{}", NULL, 0));
    assert_nopad_ok(parse_header("{\"__metadata__\":{\"format\":\"pt\",\"k\":\"\"}}", NULL, 0));

    /* any JSON whitespace may pad, as serde_json allows; whitespace inside too */
    const char *header = " \t\n\r ";
    char text[256];
    snprintf(text, sizeof text,
             "{ \"x\" :\n{\"dtype\":\"U8\",\t\"shape\":[ 1 ],\"data_offsets\":[0, 1]}}%s", header);
    size_t len = strlen(text), size;
    uint8_t *buf = make_raw(len, text, len, "A", 1, &size);
    safetensors_file f;
    assert_nopad_ok(safetensors_parse(buf, size, NULL, &f));
    assert_string_equal(f.path, "<memory>");
    safetensors_close(&f);
    free(buf);

    /* escaped and non-ASCII names come out as UTF-8 */
    buf = make_file("{\"caf\\u00e9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                    "\"q\\\"uote\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
                    "\"\xe6\x97\xa5\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
                    "abc", 3, &size);
    assert_nopad_ok(safetensors_parse(buf, size, "t.safetensors", &f));
    assert_non_null(safetensors_find(&f, "caf\xc3\xa9"));
    assert_non_null(safetensors_find(&f, "q\"uote"));
    assert_non_null(safetensors_find(&f, "\xe6\x97\xa5"));
    safetensors_close(&f);
    free(buf);
}

/* ---- malformed files: the layout ---------------------------------------------------------- */

static void test_empty_and_short_files(void **state) {
    (void)state;
    safetensors_file f;
    const char *empty = test_write_temp(0, ".safetensors", NULL, 0);
    assert_nopad_error(safetensors_open(empty, &f), NOPAD_ERR_FORMAT, "empty file");
    assert_nopad_error(safetensors_open(empty, &f), NOPAD_ERR_FORMAT, empty);
    assert_null(f.tensors);
    safetensors_close(&f);

    const char *tiny = test_write_temp(1, ".safetensors", "\x02\0\0\0\0", 5);
    assert_nopad_error(safetensors_open(tiny, &f), NOPAD_ERR_FORMAT, "5 bytes, too short");

    uint8_t seven[7] = {0};
    assert_nopad_error(safetensors_parse(seven, 7, "t.safetensors", &f), NOPAD_ERR_FORMAT,
                       "t.safetensors: file is 7 bytes");
    assert_nopad_error(safetensors_parse(NULL, 0, "t.safetensors", &f), NOPAD_ERR_FORMAT,
                       "empty file");
    assert_nopad_error(safetensors_parse(NULL, 3, "t.safetensors", &f),
                       NOPAD_ERR_INVALID_ARGUMENT, "NULL");
}

static void test_missing_file_and_directory(void **state) {
    (void)state;
    safetensors_file f;
    assert_nopad_error(safetensors_open("/nonexistent/nopad/model.safetensors", &f), NOPAD_ERR_IO,
                       "/nonexistent/nopad/model.safetensors: cannot open");
    const char *dir = test_make_temp_dir(0);
    assert_nopad_error(safetensors_open(dir, &f), NOPAD_ERR_IO, "not a regular file");
}

static void test_header_length(void **state) {
    (void)state;
    safetensors_file f;
    size_t size;
    /* the length field claims more bytes than the file has */
    uint8_t *buf = make_raw(1000, "{}", 2, NULL, 0, &size);
    assert_nopad_error(safetensors_parse(buf, size, "t.safetensors", &f), NOPAD_ERR_FORMAT,
                       "header length 1000 runs past the end of the file");
    free(buf);
    /* a length beyond any file */
    buf = make_raw(UINT64_MAX, "{}", 2, NULL, 0, &size);
    assert_nopad_error(safetensors_parse(buf, size, "t.safetensors", &f), NOPAD_ERR_FORMAT,
                       "exceeds the limit");
    free(buf);
    /* just over the reference's 100 MB bound (checked before the file size) */
    buf = make_raw(SAFETENSORS_MAX_HEADER_SIZE + 1, "{}", 2, NULL, 0, &size);
    assert_nopad_error(safetensors_parse(buf, size, "t.safetensors", &f), NOPAD_ERR_FORMAT,
                       "header length 100000001 exceeds the limit of 100000000 bytes");
    free(buf);
    /* zero-length header */
    buf = make_raw(0, NULL, 0, NULL, 0, &size);
    assert_nopad_error(safetensors_parse(buf, size, "t.safetensors", &f), NOPAD_ERR_FORMAT,
                       "header length is 0");
    free(buf);
}

static void test_truncated_data(void **state) {
    (void)state;
    const char *header = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
    uint8_t data[24] = {0};
    size_t size;
    uint8_t *buf = make_file(header, data, sizeof data, &size);
    /* via a real file cut 4 bytes short */
    const char *path = test_write_temp(0, ".safetensors", buf, size - 4);
    safetensors_file f;
    assert_nopad_error(safetensors_open(path, &f), NOPAD_ERR_FORMAT,
                       "tensor 'a' data_offsets [0, 24] run past the end of the 20-byte data "
                       "buffer");
    assert_nopad_error(safetensors_open(path, &f), NOPAD_ERR_FORMAT, path);
    free(buf);
}

static void test_offsets_past_end(void **state) {
    (void)state;
    uint8_t data[12] = {0};
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]}}", data,
                     12),
        NOPAD_ERR_FORMAT, "tensor 'a' data_offsets [0, 24] run past the end");
    /* an empty tensor placed past the end leaves a hole before it */
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[99,99]}}",
                     data, 12),
        NOPAD_ERR_FORMAT, "hole");
}

static void test_unclaimed_bytes(void **state) {
    (void)state;
    uint8_t data[16] = {0};
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", data,
                     16),
        NOPAD_ERR_FORMAT, "data buffer is 16 bytes but the tensors cover only 12");
    assert_nopad_error(parse_header("{}", data, 4), NOPAD_ERR_FORMAT, "cover only 0");
}

static void test_overlap_and_hole(void **state) {
    (void)state;
    uint8_t data[12] = {0};
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                     data, 12),
        NOPAD_ERR_FORMAT, "tensor 'b' data_offsets [4, 12] overlap tensor 'a' data_offsets [0, 8]");
    /* the same range twice is an overlap too */
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                     data, 4),
        NOPAD_ERR_FORMAT, "overlap");
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                     data, 12),
        NOPAD_ERR_FORMAT, "hole in the data buffer: bytes [4, 8) belong to no tensor");
    /* nothing at offset 0 */
    assert_nopad_error(
        parse_header("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", data, 12),
        NOPAD_ERR_FORMAT, "bytes [0, 4)");
}

static void test_begin_after_end(void **state) {
    (void)state;
    uint8_t data[8] = {0};
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", data, 8),
        NOPAD_ERR_FORMAT, "tensor 'a': data_offsets [8, 4] have begin > end");
}

static void test_size_mismatch(void **state) {
    (void)state;
    uint8_t data[12] = {0};
    assert_nopad_error(
        parse_header("{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,12]}}",
                     data, 12),
        NOPAD_ERR_FORMAT,
        "t.safetensors: tensor 'a.weight': data_offsets [0, 12] span 12 bytes but shape [2, 3] "
        "of F32 needs 24");
    /* a scalar needs one element */
    assert_nopad_error(
        parse_header("{\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[0,0]}}", NULL, 0),
        NOPAD_ERR_FORMAT, "shape [] of F16 needs 2");
    /* element count overflow (2^53 * 2^53) */
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[9007199254740992,9007199254740992],"
                     "\"data_offsets\":[0,0]}}", NULL, 0),
        NOPAD_ERR_FORMAT, "overflow");
    /* byte count overflow: 2^62 elements of 8 bytes */
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,1073741824],"
                     "\"data_offsets\":[0,0]}}", NULL, 0),
        NOPAD_ERR_FORMAT, "overflow");
}

/* ---- malformed files: the JSON ------------------------------------------------------------ */

static void test_header_not_json(void **state) {
    (void)state;
    assert_nopad_error(parse_header("{not json}", NULL, 0), NOPAD_ERR_FORMAT,
                       "t.safetensors: header is not valid JSON");
    assert_nopad_error(parse_header("{\"a\": }", NULL, 0), NOPAD_ERR_FORMAT, "not valid JSON");
    assert_nopad_error(parse_header("{\"a\":{\"dtype\":\"F32\",}}", NULL, 0), NOPAD_ERR_FORMAT,
                       "not valid JSON");
    assert_nopad_error(parse_header("{", NULL, 0), NOPAD_ERR_FORMAT, "not valid JSON");
}

static void test_header_not_object(void **state) {
    (void)state;
    assert_nopad_error(parse_header("[1, 2]", NULL, 0), NOPAD_ERR_FORMAT,
                       "must be a JSON object starting with '{', found first byte 0x5b");
    assert_nopad_error(parse_header("\"text\"", NULL, 0), NOPAD_ERR_FORMAT, "starting with '{'");
    assert_nopad_error(parse_header(" {}", NULL, 0), NOPAD_ERR_FORMAT, "starting with '{'");
    assert_nopad_error(parse_header("{\"a\": 5}", NULL, 0), NOPAD_ERR_FORMAT,
                       "tensor 'a': expected an object with dtype, shape and data_offsets, "
                       "found a number");
}

static void test_trailing_garbage(void **state) {
    (void)state;
    assert_nopad_error(parse_header("{}xyz", NULL, 0), NOPAD_ERR_FORMAT,
                       "trailing data after the header's JSON object at header byte 2");
    assert_nopad_error(parse_header("{} {}", NULL, 0), NOPAD_ERR_FORMAT, "trailing data");
    /* a NUL is neither padding nor JSON */
    size_t size;
    uint8_t *buf = make_raw(8, "{}\0     ", 8, NULL, 0, &size);
    safetensors_file f;
    assert_nopad_error(safetensors_parse(buf, size, "t.safetensors", &f), NOPAD_ERR_FORMAT,
                       "control character 0x00");
    free(buf);
}

static void test_invalid_text(void **state) {
    (void)state;
    assert_nopad_error(
        parse_header("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", NULL,
                     0),
        NOPAD_ERR_FORMAT, "not valid UTF-8 (byte 0xff at header offset 3)");
    /* overlong encoding of '/' and an encoded surrogate */
    assert_nopad_error(parse_header("{\"\xc0\xaf\":1}", NULL, 0), NOPAD_ERR_FORMAT, "UTF-8");
    assert_nopad_error(parse_header("{\"\xed\xa0\x80\":1}", NULL, 0), NOPAD_ERR_FORMAT, "UTF-8");
    assert_nopad_error(parse_header("{\"a\tb\":1}", NULL, 0), NOPAD_ERR_FORMAT,
                       "raw control character 0x09 inside a string");
    assert_nopad_error(parse_header("{\"a\\u0000b\":1}", NULL, 0), NOPAD_ERR_FORMAT,
                       "escaped NUL");
    assert_nopad_error(parse_header("{\"\\ud800\":1}", NULL, 0), NOPAD_ERR_FORMAT,
                       "not valid JSON"); /* lone surrogate escape */
    /* numbers serde_json would refuse */
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[+1],\"data_offsets\":[0,1]}}", "x", 1),
        NOPAD_ERR_FORMAT, "malformed JSON number");
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[01],\"data_offsets\":[0,1]}}", "x", 1),
        NOPAD_ERR_FORMAT, "malformed JSON number");
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[1.],\"data_offsets\":[0,1]}}", "x", 1),
        NOPAD_ERR_FORMAT, "malformed JSON number");
}

static void test_unknown_dtype(void **state) {
    (void)state;
    uint8_t data[4] = {0};
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4),
        NOPAD_ERR_UNSUPPORTED, "tensor 'w': unknown dtype 'F12'");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4),
        NOPAD_ERR_UNSUPPORTED, "'f32'");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4),
        NOPAD_ERR_FORMAT, "dtype must be a string, found a number");
}

static void test_bad_shape(void **state) {
    (void)state;
    uint8_t data[8] = {0};
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1,2],\"data_offsets\":[0,8]}}", data,
                     8),
        NOPAD_ERR_FORMAT, "tensor 'w': shape[0] = -1 is not an integer in [0, 2^53]");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,8]}}", data,
                     8),
        NOPAD_ERR_FORMAT, "shape[1] = 1.5 is not an integer");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,8]}}", data,
                     8),
        NOPAD_ERR_FORMAT, "shape[0] = 1.0000000000000001e+300");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[9007199254740994],"
                     "\"data_offsets\":[0,8]}}", data, 8),
        NOPAD_ERR_FORMAT, "shape[0]");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", data,
                     8),
        NOPAD_ERR_FORMAT, "shape[0] is a string");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", data, 8),
        NOPAD_ERR_FORMAT, "shape must be an array");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                     "\"data_offsets\":[0,1]}}", data, 1),
        NOPAD_ERR_UNSUPPORTED, "shape has 9 dims, more than the 8 supported");
    /* 8 dims is fine */
    assert_nopad_ok(parse_header(
        "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", data, 1));
}

static void test_bad_entry_keys(void **state) {
    (void)state;
    uint8_t data[4] = {0};
    assert_nopad_error(parse_header("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4),
                       NOPAD_ERR_FORMAT, "tensor 'w': missing \"dtype\"");
    assert_nopad_error(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", data, 4),
                       NOPAD_ERR_FORMAT, "missing \"data_offsets\"");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}",
                     data, 4),
        NOPAD_ERR_FORMAT, "unexpected key 'x'");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],"
                     "\"data_offsets\":[0,4]}}", data, 4),
        NOPAD_ERR_FORMAT, "key 'dtype' appears twice");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", data, 4),
        NOPAD_ERR_FORMAT, "data_offsets must be [begin, end]");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", data, 4),
        NOPAD_ERR_FORMAT, "data_offsets must be [begin, end]");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", data,
                     4),
        NOPAD_ERR_FORMAT, "data_offsets must be [begin, end]");
    assert_nopad_error(
        parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", data, 4),
        NOPAD_ERR_FORMAT, "data_offsets must be [begin, end]");
}

static void test_duplicate_names(void **state) {
    (void)state;
    uint8_t data[8] = {0};
    assert_nopad_error(
        parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                     data, 8),
        NOPAD_ERR_FORMAT, "header lists 'a' twice (tensor names must be unique)");
    assert_nopad_error(parse_header("{\"__metadata__\":{},\"__metadata__\":{}}", NULL, 0),
                       NOPAD_ERR_FORMAT, "header lists '__metadata__' twice");
}

static void test_bad_metadata(void **state) {
    (void)state;
    assert_nopad_error(parse_header("{\"__metadata__\":{\"format\":\"pt\",\"n\":1}}", NULL, 0),
                       NOPAD_ERR_FORMAT, "__metadata__ key 'n' is a number, expected a string");
    assert_nopad_error(parse_header("{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}", NULL, 0),
                       NOPAD_ERR_FORMAT, "key 'a' is an object");
    assert_nopad_error(parse_header("{\"__metadata__\":[\"pt\"]}", NULL, 0), NOPAD_ERR_FORMAT,
                       "__metadata__ must be an object of string values, found an array");
    assert_nopad_error(parse_header("{\"__metadata__\":null}", NULL, 0), NOPAD_ERR_FORMAT,
                       "found null");
    assert_nopad_error(parse_header("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", NULL, 0),
                       NOPAD_ERR_FORMAT, "__metadata__ key 'k' appears twice");
}

/* ---- checkpoints -------------------------------------------------------------------------- */

static const char shard1_header[] =
    "{\"w1\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
static const char shard2_header[] =
    "{\"w2\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
    "\"w3\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}";

/* A folder with both shards and the given index text. */
static const char *make_sharded_dir(int slot, const char *index) {
    const char *dir = test_make_temp_dir(slot);
    uint8_t d1[8], d2[8];
    put_f32(d1, 1.0f);
    put_f32(d1 + 4, 2.0f);
    put_f32(d2, 3.0f);
    put_u16(d2 + 4, 0x4080); /* 4.0 */
    put_u16(d2 + 6, 0x40a0); /* 5.0 */
    write_st_in(dir, "model-00001-of-00002.safetensors", shard1_header, d1, 8);
    write_st_in(dir, "model-00002-of-00002.safetensors", shard2_header, d2, 8);
    if (index) write_in(dir, "model.safetensors.index.json", index, strlen(index));
    return dir;
}

static const char good_index[] =
    "{\"metadata\": {\"total_size\": 16},\n"
    " \"weight_map\": {\"w1\": \"model-00001-of-00002.safetensors\",\n"
    "                \"w2\": \"model-00002-of-00002.safetensors\",\n"
    "                \"w3\": \"model-00002-of-00002.safetensors\"}}\n";

static void test_checkpoint_single(void **state) {
    (void)state;
    const char *dir = test_make_temp_dir(0);
    size_t size;
    uint8_t *buf = make_mixed_file(&size);
    write_in(dir, "model.safetensors", buf, size);
    free(buf);
    /* model.safetensors wins over an index, even a broken one */
    write_in(dir, "model.safetensors.index.json", "garbage", 7);
    safetensors_checkpoint c;
    assert_nopad_ok(safetensors_checkpoint_open(dir, &c));
    assert_int_equal(c.n_files, 1);
    assert_non_null(safetensors_checkpoint_find(&c, "c.f32"));
    assert_null(safetensors_checkpoint_find(&c, "nope"));
    safetensors_checkpoint_close(&c);
    assert_null(c.files);
    safetensors_checkpoint_close(&c);

    /* a broken single file is reported, naming it */
    dir = test_make_temp_dir(1);
    write_in(dir, "model.safetensors", "\x01\0\0\0\0\0\0\0{", 9);
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT,
                       "model.safetensors: header is not valid JSON");
    assert_null(c.files);
}

static void test_checkpoint_sharded(void **state) {
    (void)state;
    const char *dir = make_sharded_dir(0, good_index);
    safetensors_checkpoint c;
    assert_nopad_ok(safetensors_checkpoint_open(dir, &c));
    assert_int_equal(c.n_files, 2); /* shard 2 is listed twice but opened once */
    const safetensors_tensor *w1 = safetensors_checkpoint_find(&c, "w1");
    const safetensors_tensor *w3 = safetensors_checkpoint_find(&c, "w3");
    assert_non_null(w1);
    assert_non_null(safetensors_checkpoint_find(&c, "w2"));
    assert_non_null(w3);
    assert_null(safetensors_checkpoint_find(&c, "w4"));
    float v[2];
    assert_nopad_ok(safetensors_to_f32(w1, v));
    assert_true(v[0] == 1.0f && v[1] == 2.0f);
    assert_nopad_ok(safetensors_to_f32(w3, v));
    assert_true(v[0] == 4.0f && v[1] == 5.0f);
    safetensors_checkpoint_close(&c);
}

static void test_checkpoint_bad(void **state) {
    (void)state;
    safetensors_checkpoint c;

    /* neither file */
    const char *dir = test_make_temp_dir(0);
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_IO,
                       "no model.safetensors or model.safetensors.index.json");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_IO, dir);
    assert_nopad_error(safetensors_checkpoint_open("/nonexistent/nopad", &c), NOPAD_ERR_IO,
                       "/nonexistent/nopad: no model.safetensors");

    /* the index names a shard that is not there */
    dir = make_sharded_dir(1, "{\"weight_map\": {\"w1\": \"model-00001-of-00002.safetensors\","
                              " \"w9\": \"model-00003-of-00003.safetensors\"}}");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_IO,
                       "shard 'model-00003-of-00003.safetensors'");
    assert_null(c.files);

    /* the index puts a tensor in a shard that does not have it */
    dir = make_sharded_dir(2, "{\"weight_map\": {\"w1\": \"model-00001-of-00002.safetensors\","
                              " \"w2\": \"model-00001-of-00002.safetensors\"}}");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT,
                       "weight_map puts tensor 'w2' in 'model-00001-of-00002.safetensors', but "
                       "that shard has no such tensor");

    /* not JSON */
    dir = make_sharded_dir(3, "{\"weight_map\": {\"w1\": ");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT,
                       "model.safetensors.index.json: not valid JSON");
    dir = make_sharded_dir(4, "");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT, "not valid JSON");

    /* shard names that leave the folder */
    dir = make_sharded_dir(5,
                           "{\"weight_map\": {\"w1\": \"../model-00001-of-00002.safetensors\"}}");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT,
                       "shard '../model-00001-of-00002.safetensors'");
    dir = make_sharded_dir(6, "{\"weight_map\": {\"w1\": \"/etc/passwd\"}}");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT, "no '/' or '..'");

    /* structural problems */
    dir = make_sharded_dir(7, "{\"metadata\": {}}");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT,
                       "\"weight_map\" must be an object");
    dir = make_sharded_dir(0, "{\"weight_map\": {}}");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT, "lists no tensors");
    dir = make_sharded_dir(1, "{\"weight_map\": {\"w1\": 1}}");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT,
                       "entry for tensor 'w1' is a number");
    dir = make_sharded_dir(2, "[\"weight_map\"]");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT,
                       "expected a JSON object");
    dir = make_sharded_dir(3, "{\"weight_map\": {\"w1\": \"model-00001-of-00002.safetensors\"}} x");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT, "not valid JSON");
    dir = make_sharded_dir(4, "{\"weight_map\": {\"w1\": \"model-00001-of-00002.safetensors\","
                              " \"w1\": \"model-00002-of-00002.safetensors\"}}");
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT,
                       "weight_map lists tensor 'w1' twice");

    /* a malformed shard is named */
    dir = make_sharded_dir(5, good_index);
    write_in(dir, "model-00002-of-00002.safetensors", "\x02\0\0\0\0\0\0\0[]", 10);
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT,
                       "model-00002-of-00002.safetensors: header must be a JSON object");

    /* the same tensor in two shards */
    dir = make_sharded_dir(6, good_index);
    uint8_t d[8] = {0};
    write_st_in(dir, "model-00001-of-00002.safetensors",
                "{\"w1\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"w2\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                d, 8);
    assert_nopad_error(safetensors_checkpoint_open(dir, &c), NOPAD_ERR_FORMAT,
                       "tensor 'w2' is in both");
    assert_null(c.files);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_scalar_and_empty),
        cmocka_unit_test(test_padding_and_names),
        cmocka_unit_test(test_empty_and_short_files),
        cmocka_unit_test(test_missing_file_and_directory),
        cmocka_unit_test(test_header_length),
        cmocka_unit_test(test_truncated_data),
        cmocka_unit_test(test_offsets_past_end),
        cmocka_unit_test(test_unclaimed_bytes),
        cmocka_unit_test(test_overlap_and_hole),
        cmocka_unit_test(test_begin_after_end),
        cmocka_unit_test(test_size_mismatch),
        cmocka_unit_test(test_header_not_json),
        cmocka_unit_test(test_header_not_object),
        cmocka_unit_test(test_trailing_garbage),
        cmocka_unit_test(test_invalid_text),
        cmocka_unit_test(test_unknown_dtype),
        cmocka_unit_test(test_bad_shape),
        cmocka_unit_test(test_bad_entry_keys),
        cmocka_unit_test(test_duplicate_names),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_checkpoint_single),
        cmocka_unit_test(test_checkpoint_sharded),
        cmocka_unit_test(test_checkpoint_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
