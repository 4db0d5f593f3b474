#include "tests/support/docjson.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/proc.h"

json_t *docjson_block(const char *path, const char *heading)
{
    char *doc = proc_read_file(path);
    const char *h = strstr(doc, heading);
    cr_assert_not_null(h, "%s has no %s", path, heading);
    const char *block = strstr(h, "```json\n");
    cr_assert_not_null(block, "%s: no ```json block after %s", path, heading);
    block += strlen("```json\n");
    const char *end = strstr(block, "\n```");
    cr_assert_not_null(end, "%s: the block after %s is not closed", path, heading);
    json_error_t err;
    json_t *j = json_loadb(block, (size_t)(end - block), 0, &err);
    cr_assert_not_null(j, "%s: the example after %s is no JSON: its line %d: %s", path, heading,
                       err.line, err.text);
    free(doc);
    return j;
}
