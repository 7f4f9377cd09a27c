/* Unit tests for lib/oacrypt.c: the EncodingAESKey, the message signature, and decryption of
 * Official Account safe-mode pushes. The known-answer vector below was made with an independent
 * AES-CBC implementation (and SHA-1 of the sorted strings), not with this module. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oacrypt_int.h"
#include "wxguard/err.h"
#include "wxguard/msg.h"

#define EAK     "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"
#define KEY_HEX "69b71d79f8218a39259a7a29aabb2dbafc31cb3d35db7e39ebbf3d0010831051"
#define APPID   "wx_FAKEAPPID_0001"
#define TOKEN   "wxg-test-token"
#define TS      "1732330200"
#define NONCE   "123456"

/* random "0123456789abcdef", then the message below and APPID, sealed with EAK. */
static const char kat_b64[] =
    "Q3stYC6hdFzMh9T8HCvyDJd3XGghJQYcUf1O/1QxqEwnZmwboEez5qKF8tKzOUd2zOaJugPFkp4sKqW7DAA2lGv7yqwV/"
    "Pt7WpJnAt5AqjIjD1OzSqwEUhT1r953kMtvclMf1+mTUunQ3begJA1yaNt5ReXtjHy5i8WpP99cLYcfWgf0lGfRzGessiq"
    "yy9/fqK2NQ2Xc+EaSmmISuiUvgQjXd9KHJ/3Zv8HEHqvNUsC73z7QsFdd2qNaDZOpod7+aMOond/UENc8fwSQwqfFYSzL"
    "nAbaweOQ6jRaP2TSCzUtFnQSZ05x9c5JoBcu2kXNqKs/8Wd1/3DInzk3IBq4nY23Sysws3Y3dOSop4iSAGZ6tHoTmZ172u"
    "SVSDSnPFkbHzOTUWVPx4a4SKVK2J+aT/Uy/eM6cYM+pxfGHmnLCqk=";
static const char kat_msg[] =
    "<xml><ToUserName><![CDATA[gh_fake00000001]]></ToUserName>"
    "<FromUserName><![CDATA[oFAKE_openid_000000001]]></FromUserName>"
    "<CreateTime>1732329909</CreateTime><MsgType><![CDATA[text]]></MsgType>"
    "<Content><![CDATA[safe]]></Content><MsgId>24500000000000009</MsgId></xml>";
#define KAT_SIG "cb919b7f9f4fc5a877fa66c47955aec388213dd4"

static void key_of(unsigned char key[WXG__OA_AES_KEY_BYTES])
{
    assert_int_equal(wxg__oa_aes_key(EAK, key), 0);
}

static void encoding_aes_key_decodes_to_the_32_byte_key(void **state)
{
    (void)state;
    unsigned char key[WXG__OA_AES_KEY_BYTES];
    char hex[2 * WXG__OA_AES_KEY_BYTES + 1];
    key_of(key);
    for (int i = 0; i < WXG__OA_AES_KEY_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", key[i]);
    assert_string_equal(hex, KEY_HEX);
    /* Wrong length, characters outside base64, NULL. */
    assert_int_equal(wxg__oa_aes_key("abc", key), WXG_EINVAL);
    assert_int_equal(wxg__oa_aes_key(EAK "H", key), WXG_EINVAL);
    assert_int_equal(wxg__oa_aes_key("abcdefghijklmnopqrstuvwxyz0123456789ABCDEF!", key),
                     WXG_EINVAL);
    assert_int_equal(wxg__oa_aes_key("abcdefghijklmnopqrstuvwxyz0123456789ABCDEF=", key),
                     WXG_EINVAL);
    assert_int_equal(wxg__oa_aes_key(NULL, key), WXG_EINVAL);
}

static void msg_signature_is_sha1_of_the_four_sorted_strings(void **state)
{
    (void)state;
    char sig[41];
    assert_int_equal(wxg__oa_msg_signature(TOKEN, TS, NONCE, kat_b64, strlen(kat_b64), sig), 0);
    assert_string_equal(sig, KAT_SIG);
    assert_int_equal(wxg__oa_msg_verify(TOKEN, TS, NONCE, kat_b64, strlen(kat_b64), KAT_SIG), 0);
    /* Upper-case hex is the same signature. */
    assert_int_equal(wxg__oa_msg_verify(TOKEN, TS, NONCE, kat_b64, strlen(kat_b64),
                                        "CB919B7F9F4FC5A877FA66C47955AEC388213DD4"),
                     0);
    /* Another nonce, another Encrypt, a missing or short signature, an empty token: refused. */
    assert_int_equal(wxg__oa_msg_verify(TOKEN, TS, "123457", kat_b64, strlen(kat_b64), KAT_SIG),
                     WXG_EAUTH);
    assert_int_equal(wxg__oa_msg_verify(TOKEN, TS, NONCE, kat_b64, strlen(kat_b64) - 4, KAT_SIG),
                     WXG_EAUTH);
    assert_int_equal(wxg__oa_msg_verify(TOKEN, TS, NONCE, kat_b64, strlen(kat_b64), NULL),
                     WXG_EAUTH);
    assert_int_equal(wxg__oa_msg_verify(TOKEN, TS, NONCE, kat_b64, strlen(kat_b64), "cb919b"),
                     WXG_EAUTH);
    assert_int_equal(wxg__oa_msg_verify("", TS, NONCE, kat_b64, strlen(kat_b64), KAT_SIG),
                     WXG_EAUTH);
}

static void known_answer_decrypts_to_the_push(void **state)
{
    (void)state;
    unsigned char key[WXG__OA_AES_KEY_BYTES];
    key_of(key);
    char *out = NULL;
    size_t n = 0;
    char err[256] = "";
    assert_int_equal(
        wxg__oa_decrypt(key, APPID, kat_b64, strlen(kat_b64), &out, &n, err, sizeof err), 0);
    assert_int_equal(n, strlen(kat_msg));
    assert_string_equal(out, kat_msg);
    free(out);
    /* Without an AppId to check, the same. */
    assert_int_equal(wxg__oa_decrypt(key, NULL, kat_b64, strlen(kat_b64), &out, &n, NULL, 0), 0);
    assert_string_equal(out, kat_msg);
    free(out);
    /* And our own sealing with the same random bytes gives the same text. */
    char *b64 = NULL;
    assert_int_equal(wxg__oa_encrypt(key, APPID, (const unsigned char *)"0123456789abcdef", kat_msg,
                                     strlen(kat_msg), &b64),
                     0);
    assert_string_equal(b64, kat_b64);
    free(b64);
}

static void another_appid_or_key_is_refused(void **state)
{
    (void)state;
    unsigned char key[WXG__OA_AES_KEY_BYTES], other[WXG__OA_AES_KEY_BYTES];
    key_of(key);
    assert_int_equal(wxg__oa_aes_key("0000000000000000000000000000000000000000000", other), 0);
    char *out = (char *)1;
    size_t n = 7;
    char err[256] = "";
    assert_int_equal(
        wxg__oa_decrypt(key, "wx_OTHER", kat_b64, strlen(kat_b64), &out, &n, err, sizeof err),
        WXG_EFORMAT);
    assert_null(out);
    assert_int_equal(n, 0);
    assert_non_null(strstr(err, "AppId"));
    assert_int_equal(
        wxg__oa_decrypt(other, APPID, kat_b64, strlen(kat_b64), &out, &n, err, sizeof err),
        WXG_EFORMAT);
    assert_null(out);
    assert_non_null(strstr(err, "EncodingAESKey"));
}

static void broken_ciphertext_is_a_clear_error(void **state)
{
    (void)state;
    unsigned char key[WXG__OA_AES_KEY_BYTES];
    key_of(key);
    char *out = NULL;
    size_t n = 0;
    char err[256] = "";
    /* Not base64: a bad character, a length that is no multiple of 4, misplaced padding. */
    assert_int_equal(wxg__oa_decrypt(key, APPID, "ab!d", 4, &out, &n, err, sizeof err), WXG_EPARSE);
    assert_non_null(strstr(err, "base64"));
    assert_int_equal(wxg__oa_decrypt(key, APPID, "abcde", 5, &out, &n, err, sizeof err),
                     WXG_EPARSE);
    assert_int_equal(wxg__oa_decrypt(key, APPID, "ab=d", 4, &out, &n, err, sizeof err), WXG_EPARSE);
    assert_int_equal(wxg__oa_decrypt(key, APPID, "", 0, &out, &n, err, sizeof err), WXG_EPARSE);
    /* Base64, but 12 bytes: not whole AES blocks. */
    assert_int_equal(wxg__oa_decrypt(key, APPID, "AAAAAAAAAAAAAAAA", 16, &out, &n, err, sizeof err),
                     WXG_EPARSE);
    assert_non_null(strstr(err, "AES blocks"));
    /* The first 30 bytes and two others: 32 bytes, whose second block decrypts to garbage, so
     * neither the padding nor the length field can hold. */
    char cut[64];
    memcpy(cut, kat_b64, 40);
    memcpy(cut + 40, "AAA=", 4);
    assert_int_equal(wxg__oa_decrypt(key, APPID, cut, 44, &out, &n, err, sizeof err), WXG_EFORMAT);
    assert_null(out);
    /* One flipped bit in the last block breaks the padding or the AppId. */
    char *flip = strdup(kat_b64);
    assert_non_null(flip);
    size_t fl = strlen(flip);
    flip[fl - 6] = flip[fl - 6] == 'A' ? 'B' : 'A';
    assert_int_equal(wxg__oa_decrypt(key, APPID, flip, fl, &out, &n, err, sizeof err), WXG_EFORMAT);
    assert_null(out);
    free(flip);
    assert_int_equal(wxg__oa_decrypt(NULL, APPID, kat_b64, strlen(kat_b64), &out, &n, NULL, 0),
                     WXG_EINVAL);
}

static void sealing_round_trips_every_length(void **state)
{
    (void)state;
    unsigned char key[WXG__OA_AES_KEY_BYTES];
    key_of(key);
    const unsigned char rnd[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    char msg[200];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = (char)('a' + i % 26);
    /* Every padding length 1..32 occurs among these lengths, including a whole extra block. */
    for (size_t len = 0; len < sizeof msg; len++) {
        char *b64 = NULL, *out = NULL;
        size_t n = 0;
        assert_int_equal(wxg__oa_encrypt(key, APPID, rnd, msg, len, &b64), 0);
        assert_int_equal(wxg__oa_decrypt(key, APPID, b64, strlen(b64), &out, &n, NULL, 0), 0);
        assert_int_equal(n, len);
        assert_memory_equal(out, msg, len);
        free(out);
        free(b64);
    }
}

static void envelope_reader_finds_encrypt_in_xml_and_json(void **state)
{
    (void)state;
    static const char xml[] = "<xml><ToUserName><![CDATA[gh_fake00000001]]></ToUserName>"
                              "<Encrypt><![CDATA[QUJD]]></Encrypt></xml>";
    static const char json[] = "{\"ToUserName\":\"gh_fake00000001\",\"Encrypt\":\"QUJD\"}";
    char *enc = NULL;
    size_t n = 0;
    char err[256] = "";
    assert_int_equal(wxg_decode_oa_encrypt(xml, sizeof xml - 1, NULL, &enc, &n, err, sizeof err),
                     0);
    assert_int_equal(n, 4);
    assert_string_equal(enc, "QUJD");
    free(enc);
    assert_int_equal(wxg_decode_oa_encrypt(json, sizeof json - 1, NULL, &enc, &n, err, sizeof err),
                     0);
    assert_string_equal(enc, "QUJD");
    free(enc);
    /* No Encrypt, a number for Encrypt, a DTD, broken XML, too big: refused with a reason. */
    static const char plain[] = "<xml><ToUserName>gh</ToUserName></xml>";
    assert_int_equal(
        wxg_decode_oa_encrypt(plain, sizeof plain - 1, NULL, &enc, &n, err, sizeof err),
        WXG_EFORMAT);
    assert_null(enc);
    assert_non_null(strstr(err, "Encrypt"));
    static const char num[] = "{\"Encrypt\":12}";
    assert_int_equal(wxg_decode_oa_encrypt(num, sizeof num - 1, NULL, &enc, &n, err, sizeof err),
                     WXG_EFORMAT);
    static const char dtd[] =
        "<!DOCTYPE x [<!ENTITY e \"QUJD\">]><xml><Encrypt>&e;</Encrypt></xml>";
    assert_int_equal(wxg_decode_oa_encrypt(dtd, sizeof dtd - 1, NULL, &enc, &n, err, sizeof err),
                     WXG_EPARSE);
    static const char broken[] = "<xml><Encrypt>QUJD</xml>";
    assert_int_equal(
        wxg_decode_oa_encrypt(broken, sizeof broken - 1, NULL, &enc, &n, err, sizeof err),
        WXG_EPARSE);
    wxg_decode_opts_t small = {.max_bytes = 16};
    assert_int_equal(wxg_decode_oa_encrypt(xml, sizeof xml - 1, &small, &enc, &n, err, sizeof err),
                     WXG_ETOOBIG);
    assert_int_equal(wxg_decode_oa_encrypt("  ", 2, NULL, &enc, &n, err, sizeof err), WXG_EPARSE);
    assert_int_equal(wxg_decode_oa_encrypt(xml, sizeof xml - 1, NULL, NULL, &n, err, sizeof err),
                     WXG_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(encoding_aes_key_decodes_to_the_32_byte_key),
        cmocka_unit_test(msg_signature_is_sha1_of_the_four_sorted_strings),
        cmocka_unit_test(known_answer_decrypts_to_the_push),
        cmocka_unit_test(another_appid_or_key_is_refused),
        cmocka_unit_test(broken_ciphertext_is_a_clear_error),
        cmocka_unit_test(sealing_round_trips_every_length),
        cmocka_unit_test(envelope_reader_finds_encrypt_in_xml_and_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
