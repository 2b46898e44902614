# cmake -DDIR=<dir> -DOUT=<file> -P ListJava.cmake: writes the .java files under DIR (SWIG's output,
# whose names are only known after SWIG ran) one per line into OUT, for add_jar's @file sources.
file(GLOB_RECURSE _files "${DIR}/*.java")
list(SORT _files)
string(REPLACE ";" "\n" _text "${_files}")
file(WRITE "${OUT}.tmp" "${_text}\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(TOUCH_NOCREATE "${OUT}")
