# Turns every lib/lua/*.lua into a NUL-terminated C array `wxg__lua_<name>` in one generated C
# file, so that the scripts stay readable Lua in the tree and need no files at run time.
# Usage: cmake -DDIR=<lua dir> -DOUT=<generated .c> -P embed.cmake
file(GLOB scripts ${DIR}/*.lua)
list(SORT scripts)
set(body "/* Generated from the Lua files in lib/lua by lib/lua/embed.cmake. Do not edit. */\n")
string(APPEND body "#include \"guard_int.h\"\n")
foreach(script ${scripts})
  get_filename_component(name ${script} NAME_WE)
  file(READ ${script} hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
  string(REGEX REPLACE "((0x..,){16})" "\\1\n    " hex "${hex}")
  string(APPEND body "const char wxg__lua_${name}[] = {\n    ${hex}0x00};\n")
endforeach()
file(WRITE ${OUT}.tmp "${body}")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
