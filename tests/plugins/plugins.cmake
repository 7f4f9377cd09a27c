# The example external plugin, built as shared objects (MODULE libraries) and loaded by path in
# the tests, plus deliberately broken variants of it (another ABI version, no entry symbol) to
# check that the host refuses them at start-up. Included from tests/CMakeLists.txt after the
# test targets exist. A plugin links against nothing of wxguard: it only includes the headers.

function(wxg_example_plugin target)
  add_library(${target} MODULE ${CMAKE_CURRENT_LIST_DIR}/example_plugin.c)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(${target} PRIVATE wxg_build_flags)
  target_compile_definitions(${target} PRIVATE ${ARGN})
  set_target_properties(${target} PROPERTIES PREFIX "" LIBRARY_OUTPUT_DIRECTORY
                                             ${CMAKE_BINARY_DIR}/tests/plugins)
endfunction()

wxg_example_plugin(wxg_example_plugin)
wxg_example_plugin(wxg_example_plugin_a EXAMPLE_NAME="example_a")
wxg_example_plugin(wxg_example_plugin_b EXAMPLE_NAME="example_b")
wxg_example_plugin(wxg_example_plugin_bad_abi EXAMPLE_BAD_ABI)
wxg_example_plugin(wxg_example_plugin_no_entry EXAMPLE_NO_ENTRY)

set(WXG_EXAMPLE_PLUGIN_DEFS
  WXG_EXAMPLE_PLUGIN="$<TARGET_FILE:wxg_example_plugin>"
  WXG_EXAMPLE_PLUGIN_A="$<TARGET_FILE:wxg_example_plugin_a>"
  WXG_EXAMPLE_PLUGIN_B="$<TARGET_FILE:wxg_example_plugin_b>"
  WXG_EXAMPLE_PLUGIN_BAD_ABI="$<TARGET_FILE:wxg_example_plugin_bad_abi>"
  WXG_EXAMPLE_PLUGIN_NO_ENTRY="$<TARGET_FILE:wxg_example_plugin_no_entry>")
foreach(t unit.test_plugin integration.test_dlq)
  if(TARGET ${t})
    target_compile_definitions(${t} PRIVATE ${WXG_EXAMPLE_PLUGIN_DEFS})
    add_dependencies(${t} wxg_example_plugin wxg_example_plugin_a wxg_example_plugin_b
                     wxg_example_plugin_bad_abi wxg_example_plugin_no_entry)
  endif()
endforeach()

# A plugin whose effect lands before a slow call returns (slow_effect_plugin.c): the crash
# tests measure with it how many effects a killed replica leaves without their marker.
add_library(wxg_slow_effect_plugin MODULE ${CMAKE_CURRENT_LIST_DIR}/slow_effect_plugin.c)
target_include_directories(wxg_slow_effect_plugin PRIVATE ${PROJECT_SOURCE_DIR}/include)
target_link_libraries(wxg_slow_effect_plugin PRIVATE wxg_build_flags)
set_target_properties(wxg_slow_effect_plugin PROPERTIES PREFIX "" LIBRARY_OUTPUT_DIRECTORY
                                                   ${CMAKE_BINARY_DIR}/tests/plugins)
if(TARGET integration.test_consumer_crash)
  target_compile_definitions(integration.test_consumer_crash PRIVATE
    WXG_SLOW_EFFECT_PLUGIN="$<TARGET_FILE:wxg_slow_effect_plugin>")
  add_dependencies(integration.test_consumer_crash wxg_slow_effect_plugin)
endif()
