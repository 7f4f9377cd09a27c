/*
 * Common definitions shared by every public wxguard header: the export macro and the
 * library version.
 *
 * Public although no program includes it by name: every other header in include/wxguard/
 * includes it for WXG_EXPORT, so a program or plugin that includes any of them gets it, and
 * the version macros are there for a plugin built outside the tree to test against.
 */
#ifndef WXGUARD_COMMON_H
#define WXGUARD_COMMON_H

/* libwxguard is built with hidden visibility; only what is marked WXG_EXPORT is public. */
#if defined(__GNUC__) || defined(__clang__)
#define WXG_EXPORT __attribute__((visibility("default")))
#else
#define WXG_EXPORT
#endif

#define WXG_VERSION_MAJOR  0
#define WXG_VERSION_MINOR  1
#define WXG_VERSION_PATCH  0
#define WXG_VERSION_STRING "0.1.0"

#endif /* WXGUARD_COMMON_H */
