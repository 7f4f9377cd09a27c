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

/* The release's version, in this one place: CMakeLists.txt reads these three lines for the
 * project's version (the packages', the pkg-config file's), and every program prints
 * WXG_VERSION_STRING for --version and in its wxg_build_info metric. CHANGELOG.md says what
 * each version changed for an operator. */
#define WXG_VERSION_MAJOR 0
#define WXG_VERSION_MINOR 2
#define WXG_VERSION_PATCH 0

#define WXG__STR(x)  #x
#define WXG__XSTR(x) WXG__STR(x)
#define WXG_VERSION_STRING \
    WXG__XSTR(WXG_VERSION_MAJOR) "." WXG__XSTR(WXG_VERSION_MINOR) "." WXG__XSTR(WXG_VERSION_PATCH)

#endif /* WXGUARD_COMMON_H */
